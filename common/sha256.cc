#include "common/sha256.h"

#include <openssl/evp.h>

#include "common/logging.h"

namespace gradsnap {

Sha256::Sha256()
    : ctx_(EVP_MD_CTX_new(), [](void* c) { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(c)); }) {
  GS_CHECK(ctx_ != nullptr) << "EVP_MD_CTX_new";
  Reset();
}

void Sha256::Reset() {
  GS_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_.get()), EVP_sha256(), nullptr) == 1);
}

void Sha256::Update(const void* data, size_t n) {
  if (n == 0) return;
  GS_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_.get()), data, n) == 1);
}

Sha256Digest Sha256::Finish() {
  Sha256Digest d;
  unsigned int len = 0;
  GS_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_.get()), d.data(), &len) == 1 &&
           len == 32);
  return d;
}

Sha256Digest Sha256Of(const void* data, size_t n) {
  Sha256 h;
  h.Update(data, n);
  return h.Finish();
}

std::string LowerHex(const void* data, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  const uint8_t* d = static_cast<const uint8_t*>(data);
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

std::string DigestToHex(const Sha256Digest& d) { return LowerHex(d.data(), d.size()); }

std::string Sha256Hex(const void* data, size_t n) { return DigestToHex(Sha256Of(data, n)); }

}  // namespace gradsnap
