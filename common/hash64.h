// The 64-bit hashing of shard placement (client/remote_placement.h for a static --storage list,
// cluster/placement.h for cluster mode): FNV-1a over bytes and the splitmix64 finalizer. Both
// are stable across runs, builds and platforms, as placement must be.
//
// Header-only, pure functions: thread-safe.
#ifndef GRADSNAP_COMMON_HASH64_H_
#define GRADSNAP_COMMON_HASH64_H_

#include <cstddef>
#include <cstdint>

namespace gradsnap {

inline constexpr uint64_t kFnv1a64Offset = 1469598103934665603ull;

// FNV-1a of bytes [p, p + n), continuing from `h` (kFnv1a64Offset for a fresh hash).
inline uint64_t Fnv1a64(const void* p, size_t n, uint64_t h = kFnv1a64Offset) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

// splitmix64's finalizer: every input bit affects every output bit.
inline uint64_t Mix64(uint64_t h) {
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_HASH64_H_
