#include "common/crc32c.h"

#include <cstring>

namespace gradsnap {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  const Tables& tb = GetTables();
  uint32_t c = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = tb.t[7][w & 0xFF] ^ tb.t[6][(w >> 8) & 0xFF] ^ tb.t[5][(w >> 16) & 0xFF] ^
        tb.t[4][(w >> 24) & 0xFF] ^ tb.t[3][(w >> 32) & 0xFF] ^ tb.t[2][(w >> 40) & 0xFF] ^
        tb.t[1][(w >> 48) & 0xFF] ^ tb.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = tb.t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
// Three independent crc32 instruction streams hide its 3-cycle latency (about 3x one stream).
// Each stream covers one of three adjacent blocks of kLong (or kShort) bytes; the raw CRC
// register is linear over GF(2), so reg(A ++ B) = Shift_|B|(reg(A)) ^ reg_from_0(B), where
// Shift appends |B| zero bytes. The Shift operators are built from the instruction itself.
// Blocks of kLong bytes, then kMid, then kShort: the longer the blocks, the fewer the combines,
// and on data not in cache the faster (measured, 4 MiB buffers from memory with the prefetch
// below: 19 GB/s with 8 KiB blocks, 28 GB/s with 32 KiB; 15.5 GB/s before the prefetch).
constexpr size_t kLong = 32768;
constexpr size_t kMid = 8192;
constexpr size_t kShort = 256;
// Each stream prefetches this far ahead: three streams far apart defeat the hardware
// prefetcher on data not in cache.
constexpr size_t kPrefetch = 2048;

struct ShiftTable {
  uint32_t t[4][256];
  __attribute__((target("sse4.2"))) explicit ShiftTable(size_t zeros) {
    uint32_t col[32];  // the operator's image of each register bit
    for (int b = 0; b < 32; ++b) {
      uint64_t c = uint32_t{1} << b;
      for (size_t i = 0; i < zeros / 8; ++i) c = __builtin_ia32_crc32di(c, 0);
      col[b] = static_cast<uint32_t>(c);
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t x = 0;
        for (int b = 0; b < 8; ++b) {
          if (v & (1u << b)) x ^= col[8 * k + b];
        }
        t[k][v] = x;
      }
    }
  }
  uint32_t Shift(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

const ShiftTable& LongShift() {
  static const ShiftTable table(kLong);
  return table;
}

const ShiftTable& MidShift() {
  static const ShiftTable table(kMid);
  return table;
}

const ShiftTable& ShortShift() {
  static const ShiftTable table(kShort);
  return table;
}

__attribute__((target("sse4.2"))) inline uint64_t Load64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// Runs whole triples of `block`-byte blocks (a multiple of 64); returns the register after them.
__attribute__((target("sse4.2"))) uint64_t Triples(uint64_t c0, const uint8_t** pp, size_t* np,
                                                   size_t block, const ShiftTable& shift) {
  const uint8_t* p = *pp;
  size_t n = *np;
  while (n >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* end = p + block;
    do {
      // Only a hint: a prefetch past the buffer's end does not fault.
      __builtin_prefetch(p + kPrefetch);
      __builtin_prefetch(p + block + kPrefetch);
      __builtin_prefetch(p + 2 * block + kPrefetch);
      for (int k = 0; k < 64; k += 8) {
        c0 = __builtin_ia32_crc32di(c0, Load64(p + k));
        c1 = __builtin_ia32_crc32di(c1, Load64(p + block + k));
        c2 = __builtin_ia32_crc32di(c2, Load64(p + 2 * block + k));
      }
      p += 64;
    } while (p < end);
    c0 = shift.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = shift.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    p += 2 * block;
    n -= 3 * block;
  }
  *pp = p;
  *np = n;
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = static_cast<uint32_t>(~crc);
  if (n >= 3 * kShort) {
    c = Triples(c, &p, &n, kLong, LongShift());
    c = Triples(c, &p, &n, kMid, MidShift());
    c = Triples(c, &p, &n, kShort, ShortShift());
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ExtendPortable(crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (HaveSse42()) return ExtendSse42(crc, p, n);
#endif
  return ExtendPortable(crc, p, n);
}

}  // namespace gradsnap
