#include "common/token.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/small_file.h"
#include "common/sha256.h"

namespace gradsnap {

absl::StatusOr<std::string> MintJobToken(absl::string_view secret, absl::string_view job) {
  if (secret.empty()) return absl::InvalidArgumentError("empty token secret");
  absl::Status s = ValidateName(job, "job name");
  if (!s.ok()) return s;
  Sha256Digest mac;
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(job.data()), job.size(), mac.data(),
           &len) == nullptr ||
      len != mac.size()) {
    return absl::InternalError("HMAC-SHA256 failed");
  }
  return absl::StrCat("gs1.", DigestToHex(mac));
}

bool CheckJobToken(absl::string_view secret, absl::string_view job, absl::string_view token) {
  absl::StatusOr<std::string> want = MintJobToken(secret, job);
  if (!want.ok() || want->size() != token.size()) return false;
  return CRYPTO_memcmp(want->data(), token.data(), token.size()) == 0;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  auto read = ReadSmallFile(path, "secret file");
  if (!read.ok()) return read.status();
  std::string secret = *std::move(read);
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (secret.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("secret file ", path, " holds fewer than 16 bytes"));
  }
  return secret;
}

}  // namespace gradsnap
