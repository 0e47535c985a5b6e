// Reading whole input files with a size bound, so a directory, a FIFO or /dev/zero named by
// mistake is one clear error, never a hang or an out-of-memory abort. ReadSmallFile for small
// inputs (tokens, secrets, PEM certificates); AppendFile for large ones (the trainer's corpus,
// GiBs), read into one allocation sized up front.
#ifndef GRADSNAP_COMMON_SMALL_FILE_H_
#define GRADSNAP_COMMON_SMALL_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsnap {

// Default bound of ReadSmallFile: 1 MiB.
constexpr size_t kMaxSmallFileBytes = 1 << 20;

// The bytes of the regular file `path` (`what` names it in errors: "token file").
// NOT_FOUND if it cannot be opened; INVALID_ARGUMENT if it is not a regular file or holds more
// than max_bytes; a read error as PosixError (EIO is DATA_LOSS).
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what,
                                          size_t max_bytes = kMaxSmallFileBytes);

// Appends the bytes of the regular file `path` to *out, which holds at most max_total bytes
// afterwards. The size is taken when the file is opened (a file that shrinks meanwhile gives
// what is left, one that grows gives that size). Errors as ReadSmallFile; INVALID_ARGUMENT when
// the file would take *out past max_total, before anything is read. On error *out may hold part
// of the file.
absl::Status AppendFile(const std::string& path, const char* what, uint64_t max_total,
                        std::vector<uint8_t>* out);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_SMALL_FILE_H_
