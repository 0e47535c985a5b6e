// Per-job bearer tokens (DESIGN.md section 6): token = "gs1." + hex(HMAC-SHA256(secret, job)).
// The server holds the secret; `gradsnap token JOB --secret-file F` mints tokens for users.
// A token names its job implicitly, so a token for job A never authorizes job B.
#ifndef GRADSNAP_COMMON_TOKEN_H_
#define GRADSNAP_COMMON_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {

// Mints the token of `job`. INVALID_ARGUMENT for a bad job name or an empty secret.
absl::StatusOr<std::string> MintJobToken(absl::string_view secret, absl::string_view job);

// True when `token` is the token of `job` under `secret` (constant-time comparison).
bool CheckJobToken(absl::string_view secret, absl::string_view job, absl::string_view token);

// Reads a secret file: its bytes with one trailing newline stripped. Fails when the file is
// missing, empty, or shorter than 16 bytes.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_TOKEN_H_
