// Per-tensor content digest algorithms. Public (installed with gradsnap/client.h): a manifest
// names the algorithm each shard's tensor digests were computed with (docs/format.md,
// "Digests"). The numeric values are part of the on-disk and wire formats: never renumber.
#ifndef GRADSNAP_INCLUDE_GRADSNAP_DIGEST_ALGO_H_
#define GRADSNAP_INCLUDE_GRADSNAP_DIGEST_ALGO_H_

#include <cstdint>

namespace gradsnap {

// kSha256: SHA-256, 64 lower-case hex digits. kXxh3_128: XXH3-128, 32 lower-case hex digits
// (the default for new shards).
enum class DigestAlgo : uint8_t { kSha256 = 1, kXxh3_128 = 2 };

// "sha256" or "xxh3-128".
const char* DigestAlgoName(DigestAlgo algo);

}  // namespace gradsnap

#endif  // GRADSNAP_INCLUDE_GRADSNAP_DIGEST_ALGO_H_
