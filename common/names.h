// Validation of user-supplied names (jobs, tensors): `[A-Za-z0-9._-]{1,128}`, and never "." or
// "..", so a name can never escape a directory or inject a key separator.
#ifndef GRADSNAP_COMMON_NAMES_H_
#define GRADSNAP_COMMON_NAMES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradsnap {

constexpr size_t kMaxNameLength = 128;

// OK, or INVALID_ARGUMENT naming `what` ("job name", "tensor name") and the offending input.
absl::Status ValidateName(absl::string_view name, absl::string_view what);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_NAMES_H_
