#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsnap {

absl::Status PosixError(absl::string_view context, int error_number) {
  std::string msg = absl::StrCat(context, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case EINTR:
    case EAGAIN:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      return absl::UnavailableError(msg);
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
    case ENOTDIR:
      return absl::InvalidArgumentError(msg);
    case EIO:
      return absl::DataLossError(msg);
    default:
      return absl::UnknownError(msg);
  }
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
