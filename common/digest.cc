#include "common/digest.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include "common/logging.h"

namespace gradsnap {
namespace {

std::string Hex(const uint8_t* d, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

}  // namespace

const char* DigestAlgoName(DigestAlgo algo) {
  return algo == DigestAlgo::kSha256 ? "sha256" : "xxh3-128";
}

bool ParseDigestAlgo(absl::string_view name, DigestAlgo* out) {
  if (name == "sha256") {
    *out = DigestAlgo::kSha256;
  } else if (name == "xxh3" || name == "xxh3-128") {
    *out = DigestAlgo::kXxh3_128;
  } else {
    return false;
  }
  return true;
}

bool IsKnownDigestAlgo(uint8_t v) {
  return v == static_cast<uint8_t>(DigestAlgo::kSha256) ||
         v == static_cast<uint8_t>(DigestAlgo::kXxh3_128);
}

size_t DigestHexLength(DigestAlgo algo) { return algo == DigestAlgo::kSha256 ? 64 : 32; }

bool IsDigestHex(DigestAlgo algo, absl::string_view hex) {
  if (hex.size() != DigestHexLength(algo)) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Digester::Digester(DigestAlgo algo) : algo_(algo) {
  if (algo_ == DigestAlgo::kSha256) {
    state_ = EVP_MD_CTX_new();
  } else {
    GS_CHECK(algo_ == DigestAlgo::kXxh3_128) << "unknown digest algorithm";
    state_ = XXH3_createState();
  }
  GS_CHECK(state_ != nullptr) << "digest state allocation";
  Reset();
}

Digester::~Digester() {
  if (algo_ == DigestAlgo::kSha256) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(state_));
  } else {
    XXH3_freeState(static_cast<XXH3_state_t*>(state_));
  }
}

void Digester::Reset() {
  if (algo_ == DigestAlgo::kSha256) {
    GS_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(state_), EVP_sha256(), nullptr) == 1);
  } else {
    GS_CHECK(XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)) == XXH_OK);
  }
}

void Digester::Update(const void* data, size_t n) {
  if (n == 0) return;
  if (algo_ == DigestAlgo::kSha256) {
    GS_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(state_), data, n) == 1);
  } else {
    GS_CHECK(XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, n) == XXH_OK);
  }
}

std::string Digester::FinishHex() {
  std::string hex;
  if (algo_ == DigestAlgo::kSha256) {
    uint8_t d[32];
    unsigned int len = 0;
    GS_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(state_), d, &len) == 1 && len == 32);
    hex = Hex(d, 32);
  } else {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)));
    hex = Hex(c.digest, sizeof(c.digest));
  }
  Reset();
  return hex;
}

std::string DigestHex(DigestAlgo algo, const void* data, size_t n) {
  Digester d(algo);
  d.Update(data, n);
  return d.FinishHex();
}

}  // namespace gradsnap
