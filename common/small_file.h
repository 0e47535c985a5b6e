// Reading small input files (tokens, secrets, PEM certificates) with a size bound, so a
// directory, a FIFO or /dev/zero named by mistake is one clear error, never a hang or an
// out-of-memory abort.
#ifndef GRADSNAP_COMMON_SMALL_FILE_H_
#define GRADSNAP_COMMON_SMALL_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace gradsnap {

// Default bound of ReadSmallFile: 1 MiB.
constexpr size_t kMaxSmallFileBytes = 1 << 20;

// The bytes of the regular file `path` (`what` names it in errors: "token file").
// NOT_FOUND if it cannot be opened; INVALID_ARGUMENT if it is not a regular file or holds more
// than max_bytes.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what,
                                          size_t max_bytes = kMaxSmallFileBytes);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_SMALL_FILE_H_
