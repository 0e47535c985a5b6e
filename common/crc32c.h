// CRC-32C (Castagnoli), the checksum of every stored chunk.
//
// Uses the SSE4.2 crc32 instruction when the CPU has it, three interleaved streams over
// blocks of 8 KiB and 256 bytes (tens of GB/s per core), and a slicing-by-8 table otherwise;
// both give the same values. Thread-safe, no state.
#ifndef GRADSNAP_COMMON_CRC32C_H_
#define GRADSNAP_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace gradsnap {

// Returns the CRC-32C of data[0, n) continuing from `crc` (the value for earlier bytes; 0 to
// start). Extend(Extend(0, a), b) == Crc32c(a ++ b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The table-driven implementation, whatever the CPU (tests compare the two).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_CRC32C_H_
