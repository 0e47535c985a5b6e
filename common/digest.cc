#include "common/digest.h"

#include <xxhash.h>
// Runtime dispatch to the widest vector unit the CPU has (AVX-512, AVX2, SSE2): the plain
// XXH3 entry points of the library are built for SSE2 only, about 4x slower per byte.
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include "common/logging.h"
#include "common/sha256.h"

namespace gradsnap {

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

// SHA-256 is common/sha256.h's; this class adds XXH3-128 behind the same interface.
Digester::Digester(DigestAlgo algo)
    : algo_(algo),
      xxh_(nullptr, [](void* s) { XXH3_freeState(static_cast<XXH3_state_t*>(s)); }) {
  if (algo_ == DigestAlgo::kSha256) {
    sha_ = std::make_unique<Sha256>();
    return;
  }
  GS_CHECK(algo_ == DigestAlgo::kXxh3_128) << "unknown digest algorithm";
  xxh_.reset(XXH3_createState());
  GS_CHECK(xxh_ != nullptr) << "digest state allocation";
  Reset();
}

void Digester::Reset() {
  if (sha_ != nullptr) {
    sha_->Reset();
  } else {
    GS_CHECK(XXH3_128bits_reset(static_cast<XXH3_state_t*>(xxh_.get())) == XXH_OK);
  }
}

void Digester::Update(const void* data, size_t n) {
  if (n == 0) return;
  if (sha_ != nullptr) {
    sha_->Update(data, n);
  } else {
    GS_CHECK(XXH3_128bits_update(static_cast<XXH3_state_t*>(xxh_.get()), data, n) == XXH_OK);
  }
}

std::string Digester::FinishHex() {
  std::string hex;
  if (sha_ != nullptr) {
    hex = DigestToHex(sha_->Finish());
  } else {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(static_cast<XXH3_state_t*>(xxh_.get())));
    hex = LowerHex(c.digest, sizeof(c.digest));
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
