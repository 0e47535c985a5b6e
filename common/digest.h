// Per-tensor content digests: the algorithm a checkpoint's tensors are hashed with, recorded
// per shard in the metadata (docs/format.md, "Digests") and verified on every read.
//
//   kXxh3_128  XXH3-128 (libxxhash), 32 lower-case hex digits of the canonical (big-endian)
//              128-bit value, as `xxh128sum` prints it. The default: tens of GB/s per core.
//   kSha256    SHA-256 (OpenSSL), 64 lower-case hex digits. Selectable; stores written before
//              digests were selectable (no algorithm field) are SHA-256.
//
// THREAD SAFETY: a Digester is used by one thread at a time; the free functions are thread-safe.
#ifndef GRADSNAP_COMMON_DIGEST_H_
#define GRADSNAP_COMMON_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/sha256.h"
#include "gradsnap/digest_algo.h"  // IWYU pragma: export

namespace gradsnap {

// DigestAlgo and DigestAlgoName: include/gradsnap/digest_algo.h (public).
// Accepts "sha256", "xxh3" and "xxh3-128". False for anything else.
bool ParseDigestAlgo(absl::string_view name, DigestAlgo* out);
// True when `v` is the stored value of a known algorithm.
bool IsKnownDigestAlgo(uint8_t v);
// Length of the algorithm's lower-case hex digest (64 or 32).
size_t DigestHexLength(DigestAlgo algo);
// True when `hex` is a well-formed digest of `algo` (the right length, lower-case hex).
bool IsDigestHex(DigestAlgo algo, absl::string_view hex);

// Incremental digest of one byte stream.
class Digester {
 public:
  explicit Digester(DigestAlgo algo);  // movable, not copyable

  DigestAlgo algo() const { return algo_; }
  void Update(const void* data, size_t n);
  // Lower-case hex of the digest of everything since construction or Reset(); then Reset()s.
  std::string FinishHex();
  void Reset();

 private:
  DigestAlgo algo_;
  std::unique_ptr<Sha256> sha_;  // kSha256
  // kXxh3_128: XXH3_state_t*, kept opaque so xxhash.h stays out of ours.
  std::unique_ptr<void, void (*)(void*)> xxh_;
};

// Lower-case hex digest of data[0, n).
std::string DigestHex(DigestAlgo algo, const void* data, size_t n);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_DIGEST_H_
