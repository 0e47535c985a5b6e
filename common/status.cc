#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsnap {

namespace {

// The code of each errno value a caller can act on; any other is UNKNOWN.
struct ErrnoCode {
  int error_number;
  absl::StatusCode code;
};
constexpr ErrnoCode kErrnoCodes[] = {
    // Out of space or memory.
    {ENOSPC, absl::StatusCode::kResourceExhausted},
    {EDQUOT, absl::StatusCode::kResourceExhausted},
    {ENOMEM, absl::StatusCode::kResourceExhausted},
    {EMFILE, absl::StatusCode::kResourceExhausted},
    {ENFILE, absl::StatusCode::kResourceExhausted},
    {ENOENT, absl::StatusCode::kNotFound},
    {EEXIST, absl::StatusCode::kAlreadyExists},
    {EACCES, absl::StatusCode::kPermissionDenied},
    {EPERM, absl::StatusCode::kPermissionDenied},
    {EROFS, absl::StatusCode::kPermissionDenied},
    // Transient: retried.
    {EINTR, absl::StatusCode::kUnavailable},
    {EAGAIN, absl::StatusCode::kUnavailable},
    {ECONNREFUSED, absl::StatusCode::kUnavailable},
    {ECONNRESET, absl::StatusCode::kUnavailable},
    {EPIPE, absl::StatusCode::kUnavailable},
    {EINVAL, absl::StatusCode::kInvalidArgument},
    {ENAMETOOLONG, absl::StatusCode::kInvalidArgument},
    {EISDIR, absl::StatusCode::kInvalidArgument},
    {ENOTDIR, absl::StatusCode::kInvalidArgument},
    // The device failed to read or write: the data may be gone.
    {EIO, absl::StatusCode::kDataLoss},
};

}  // namespace

absl::Status PosixError(absl::string_view context, int error_number) {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  for (const ErrnoCode& e : kErrnoCodes) {
    if (e.error_number == error_number) code = e.code;
  }
  return absl::Status(code, absl::StrCat(context, ": ", std::strerror(error_number)));
}

absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

absl::Status SupersededError(absl::string_view job, uint64_t newest, uint64_t request) {
  return absl::FailedPreconditionError(absl::StrCat("job ", job, ": superseded by attempt ",
                                                    newest, " (request epoch ", request, ")"));
}

bool IsSuperseded(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) &&
         s.message().find("superseded by attempt") != absl::string_view::npos;
}

}  // namespace gradsnap
