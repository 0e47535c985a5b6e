// Status helpers shared by every part of gradsnap.
//
// gradsnap returns absl::Status / absl::StatusOr<T> everywhere. The codes carry meaning the
// caller acts on (STYLE.md): UNAVAILABLE is retried, DATA_LOSS is a checksum or format failure
// and is never retried silently, RESOURCE_EXHAUSTED is out of space or memory,
// FAILED_PRECONDITION is a wrong state, INVALID_ARGUMENT is bad input.
//
// Debian's Abseil (20220623) has no RETURN_IF_ERROR, so the two macros live here.
#ifndef GRADSNAP_COMMON_STATUS_H_
#define GRADSNAP_COMMON_STATUS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {

// Converts an errno value into a Status with a code the caller can act on (ENOSPC and EDQUOT
// become RESOURCE_EXHAUSTED, ENOENT NOT_FOUND, EINTR/EAGAIN UNAVAILABLE, EIO DATA_LOSS...).
// `context` names the operation and the file, e.g. "pwrite /data/seg-000001".
// The one place where errno becomes a Status.
absl::Status PosixError(absl::string_view context, int error_number);

// Prefixes the message of a non-OK status with `context`, keeping its code.
absl::Status Annotate(const absl::Status& s, absl::string_view context);

// Writer fencing (storage/epoch.h): FAILED_PRECONDITION "job J: superseded by attempt N
// (request epoch E)", and whether a status (possibly annotated) is that refusal.
absl::Status SupersededError(absl::string_view job, uint64_t newest, uint64_t request);
bool IsSuperseded(const absl::Status& s);

}  // namespace gradsnap

#define GS_STATUS_CONCAT_INNER_(a, b) a##b
#define GS_STATUS_CONCAT_(a, b) GS_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status gs_status_ = (expr);               \
    if (!gs_status_.ok()) return gs_status_;          \
  } while (0)

// ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define ASSIGN_OR_RETURN(lhs, expr) \
  GS_ASSIGN_OR_RETURN_IMPL_(GS_STATUS_CONCAT_(gs_statusor_, __LINE__), lhs, expr)
#define GS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // GRADSNAP_COMMON_STATUS_H_
