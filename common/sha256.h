// SHA-256 through OpenSSL's EVP interface: the per-tensor digest in every manifest and the
// trainer's params_sha256. Not thread-safe per object; use one Sha256 per thread.
#ifndef GRADSNAP_COMMON_SHA256_H_
#define GRADSNAP_COMMON_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gradsnap {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();  // movable, not copyable

  void Update(const void* data, size_t n);
  Sha256Digest Finish();  // the object may be reused after Reset()
  void Reset();

 private:
  // EVP_MD_CTX*, kept opaque so OpenSSL headers stay out of ours.
  std::unique_ptr<void, void (*)(void*)> ctx_;
};

// Lower-case hex of the bytes data[0, n).
std::string LowerHex(const void* data, size_t n);

Sha256Digest Sha256Of(const void* data, size_t n);
std::string DigestToHex(const Sha256Digest& d);
// Lower-case hex of the SHA-256 of data[0, n).
std::string Sha256Hex(const void* data, size_t n);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_SHA256_H_
