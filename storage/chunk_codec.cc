#include "storage/chunk_codec.h"

#include <zstd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crc32c.h"

namespace gradsnap {
namespace storage {
namespace {

void Put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }  // x86-64: little-endian
void Put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint16_t Get16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
uint32_t Get32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t Get64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

void WriteHeader(const ChunkHeader& h, uint8_t* p) {
  Put32(p + 0, kChunkMagic);
  Put16(p + 4, kChunkVersion);
  p[6] = static_cast<uint8_t>(h.codec);
  p[7] = static_cast<uint8_t>(h.filter);
  p[8] = h.element_size;
  p[9] = p[10] = p[11] = 0;
  Put32(p + 12, h.raw_len);
  Put32(p + 16, h.stored_len);
  Put64(p + 20, h.stream_offset);
  Put32(p + 28, h.crc_raw);
  Put32(p + 32, h.crc_stored);
  Put32(p + 36, Crc32c(p, 36));
}

#if defined(__x86_64__)
// SSSE3 versions: 16 elements per step, a 16x4 (or 16x2) byte transpose done with one pshufb
// per vector plus dword/qword unpacks. Several GB/s per core, so shuffling never limits a
// pipeline that zstd and the disk set the pace of. The scalar loops finish the tail.
const __m128i kGroup4 = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
const __m128i kGroup2 = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);

// W = 4 or 2: pshufb groups byte k of the elements of each vector, then the vectors' groups
// are interleaved into the W planes.
template <size_t W>
__attribute__((target("ssse3"))) size_t ShuffleSsse3(const uint8_t* in, uint8_t* out,
                                                     size_t elems) {
  static_assert(W == 2 || W == 4);
  const __m128i group = W == 4 ? kGroup4 : kGroup2;
  size_t i = 0;
  for (; i + 16 <= elems; i += 16) {
    const __m128i* s = reinterpret_cast<const __m128i*>(in + W * i);
    __m128i v[W];
    for (size_t k = 0; k < W; ++k) v[k] = _mm_shuffle_epi8(_mm_loadu_si128(s + k), group);
    __m128i plane[W];
    if constexpr (W == 4) {
      __m128i a = _mm_unpacklo_epi32(v[0], v[1]), b = _mm_unpackhi_epi32(v[0], v[1]);
      __m128i c = _mm_unpacklo_epi32(v[2], v[3]), d = _mm_unpackhi_epi32(v[2], v[3]);
      plane[0] = _mm_unpacklo_epi64(a, c);
      plane[1] = _mm_unpackhi_epi64(a, c);
      plane[2] = _mm_unpacklo_epi64(b, d);
      plane[3] = _mm_unpackhi_epi64(b, d);
    } else {
      plane[0] = _mm_unpacklo_epi64(v[0], v[1]);
      plane[1] = _mm_unpackhi_epi64(v[0], v[1]);
    }
    for (size_t k = 0; k < W; ++k) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k * elems + i), plane[k]);
    }
  }
  return i;
}

__attribute__((target("ssse3"))) size_t Unshuffle4Ssse3(const uint8_t* in, uint8_t* out,
                                                        size_t elems) {
  size_t i = 0;
  for (; i + 16 <= elems; i += 16) {
    __m128i p0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 0 * elems + i));
    __m128i p1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 1 * elems + i));
    __m128i p2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * elems + i));
    __m128i p3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 3 * elems + i));
    __m128i a = _mm_unpacklo_epi8(p0, p1), b = _mm_unpackhi_epi8(p0, p1);
    __m128i c = _mm_unpacklo_epi8(p2, p3), d = _mm_unpackhi_epi8(p2, p3);
    __m128i* o = reinterpret_cast<__m128i*>(out + 4 * i);
    _mm_storeu_si128(o + 0, _mm_unpacklo_epi16(a, c));
    _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(a, c));
    _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(b, d));
    _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(b, d));
  }
  return i;
}

size_t Unshuffle2Sse2(const uint8_t* in, uint8_t* out, size_t elems) {
  size_t i = 0;
  for (; i + 16 <= elems; i += 16) {
    __m128i p0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    __m128i p1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + elems + i));
    __m128i* o = reinterpret_cast<__m128i*>(out + 2 * i);
    _mm_storeu_si128(o + 0, _mm_unpacklo_epi8(p0, p1));
    _mm_storeu_si128(o + 1, _mm_unpackhi_epi8(p0, p1));
  }
  return i;
}

bool HaveSsse3() {
  static const bool have = __builtin_cpu_supports("ssse3");
  return have;
}
#endif

// Elements [from, elems) of a plane layout, scalar: byte p of element i is out[p * elems + i]
// (shuffle) or comes from in[p * elems + i] (unshuffle).
template <size_t W, bool kShuffle>
void PlanesScalar(const uint8_t* in, uint8_t* out, size_t from, size_t elems) {
  for (size_t p = 0; p < W; ++p) {
    for (size_t i = from; i < elems; ++i) {
      if constexpr (kShuffle) {
        out[p * elems + i] = in[i * W + p];
      } else {
        out[i * W + p] = in[p * elems + i];
      }
    }
  }
}

// The SIMD kernels where there is one (they return how many elements they did), the scalar
// loop for the rest.
template <size_t W, bool kShuffle>
void Planes(const uint8_t* in, uint8_t* out, size_t elems) {
  size_t done = 0;
#if defined(__x86_64__)
  if constexpr (W == 4) {
    if (HaveSsse3()) done = kShuffle ? ShuffleSsse3<4>(in, out, elems) : Unshuffle4Ssse3(in, out, elems);
  } else if constexpr (W == 2) {
    if (!kShuffle) done = Unshuffle2Sse2(in, out, elems);
    else if (HaveSsse3()) done = ShuffleSsse3<2>(in, out, elems);
  }
#endif
  PlanesScalar<W, kShuffle>(in, out, done, elems);
}

// Byte shuffle (kShuffle) or unshuffle of n bytes; a tail shorter than one element is copied.
template <bool kShuffle>
void Transpose(const uint8_t* in, uint8_t* out, size_t n, size_t width) {
  size_t elems = width > 1 ? n / width : 0;
  switch (width) {
    case 2: Planes<2, kShuffle>(in, out, elems); break;
    case 4: Planes<4, kShuffle>(in, out, elems); break;
    case 8: Planes<8, kShuffle>(in, out, elems); break;
    default: elems = 0; break;
  }
  // The tail past whole elements (none for an empty input, whose pointers may be null).
  if (n > elems * width) std::memcpy(out + elems * width, in + elems * width, n - elems * width);
}

// Whether a record header equals the chunk's metadata, field by field.
bool SameHeader(const ChunkHeader& h, const ChunkHeader& e) {
  return h.codec == e.codec && h.filter == e.filter && h.element_size == e.element_size &&
         h.raw_len == e.raw_len && h.stored_len == e.stored_len &&
         h.stream_offset == e.stream_offset && h.crc_raw == e.crc_raw &&
         h.crc_stored == e.crc_stored;
}

}  // namespace

size_t MaxRecordSize(size_t raw_len) {
  return kChunkHeaderSize + ZSTD_compressBound(raw_len);
}

void ByteShuffle(const uint8_t* in, uint8_t* out, size_t n, size_t width) {
  Transpose<true>(in, out, n, width);
}

void ByteUnshuffle(const uint8_t* in, uint8_t* out, size_t n, size_t width) {
  Transpose<false>(in, out, n, width);
}

ChunkEncoder::ChunkEncoder(const CodecOptions& options)
    : options_(options), cctx_(ZSTD_createCCtx()) {
  ZSTD_CCtx_setParameter(static_cast<ZSTD_CCtx*>(cctx_), ZSTD_c_compressionLevel,
                         options_.zstd_level);
}

ChunkEncoder::~ChunkEncoder() {
  ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_));
  ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(dctx_));
}

bool CompressionPays(const CompressionCosts& c, double ratio, double max_ratio) {
  if (!(ratio <= max_ratio) || !(c.disk_bps > 0)) return false;
  return c.encoders * c.encode_bps >= c.disk_bps && c.decoders * c.decode_bps >= c.disk_bps;
}

ChunkHeader ChunkEncoder::EncodeInPlace(uint8_t* rec, size_t n, uint32_t crc_raw, DType dtype,
                                        uint64_t stream_offset, bool try_compress, uint8_t* alt,
                                        bool* in_alt) {
  const uint8_t* raw = rec + kChunkHeaderSize;
  ChunkHeader h;
  h.raw_len = static_cast<uint32_t>(n);
  h.stream_offset = stream_offset;
  h.crc_raw = crc_raw;
  *in_alt = false;
  probe_ = ProbeResult();
  // With the cost model a chunk too small to probe has nothing to measure with: stored raw.
  const size_t min_n = use_costs_ ? 4 * kCompressProbeBytes : 64;
  if (try_compress && options_.zstd_level > 0 && n >= min_n) {
    const size_t width = DTypeSize(dtype);
    ChunkHeader c = h;
    const bool shuffle = options_.shuffle && DTypeIsFloat(dtype) && width > 1;
    if (shuffle) {
      c.filter = ChunkFilter::kShuffle;
      c.element_size = static_cast<uint8_t>(width);
    }
    uint8_t* payload = alt + kChunkHeaderSize;
    if (n >= 4 * kCompressProbeBytes && !Pays(raw, kCompressProbeBytes, shuffle ? width : 1,
                                                 payload)) {
      return WriteRawHeader(rec, n, crc_raw, stream_offset);
    }
    size_t z = Compress(raw, n, shuffle ? width : 1, payload);
    if (!ZSTD_isError(z) && z <= Limit(n)) {
      c.codec = ChunkCodec::kZstd;
      c.stored_len = static_cast<uint32_t>(z);
      c.crc_stored = Crc32c(payload, z);
      WriteHeader(c, alt);
      *in_alt = true;
      return c;
    }
  }
  return WriteRawHeader(rec, n, crc_raw, stream_offset);
}

size_t ChunkEncoder::Limit(size_t n) const {
  return static_cast<size_t>(static_cast<double>(n) * options_.max_compressed_ratio);
}

size_t ChunkEncoder::Compress(const uint8_t* raw, size_t n, size_t width, uint8_t* out) {
  const uint8_t* src = raw;
  if (width > 1) {
    if (scratch_.size() < n) scratch_.resize(n);
    ByteShuffle(raw, scratch_.data(), n, width);
    src = scratch_.data();
  }
  return ZSTD_compress2(static_cast<ZSTD_CCtx*>(cctx_), out, ZSTD_compressBound(n), src, n);
}

bool ChunkEncoder::Pays(const uint8_t* raw, size_t n, size_t width, uint8_t* out) {
  // A small frame compresses a little worse than the whole chunk will: the probe only has to
  // get halfway from "no gain" to max_compressed_ratio (noise stays above it).
  Stopwatch sw;
  size_t z = Compress(raw, n, width, out);
  if (ZSTD_isError(z)) return false;
  probe_.ran = true;
  probe_.ratio = static_cast<double>(z) / static_cast<double>(n);
  if (z > (n + Limit(n)) / 2) return false;
  if (!use_costs_) return true;
  probe_.encode_bps = static_cast<double>(n) / std::max(sw.ElapsedSeconds(), 1e-9);
  TimeDecode(out, z, n, width);
  CompressionCosts c = costs_;
  c.encode_bps = probe_.encode_bps;
  c.decode_bps = probe_.decode_bps;
  // The halfway rule above already holds; the model asks for the whole chunk's limit.
  return CompressionPays(c, probe_.ratio, options_.max_compressed_ratio);
}

void ChunkEncoder::TimeDecode(const uint8_t* frame, size_t z, size_t n, size_t width) {
  if (dctx_ == nullptr) dctx_ = ZSTD_createDCtx();
  if (probe_out_.size() < 2 * n) probe_out_.resize(2 * n);
  uint8_t* out = probe_out_.data();
  Stopwatch sw;
  size_t d = ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(dctx_), out, n, frame, z);
  if (ZSTD_isError(d) || d != n) return;  // decode_bps stays 0: CompressionPays says no
  if (width > 1) ByteUnshuffle(out, out + n, n, width);
  probe_.decode_bps = static_cast<double>(n) / std::max(sw.ElapsedSeconds(), 1e-9);
}

ChunkHeader WriteRawHeader(uint8_t* rec, size_t n, uint32_t crc_raw, uint64_t stream_offset) {
  ChunkHeader h;
  h.raw_len = static_cast<uint32_t>(n);
  h.stream_offset = stream_offset;
  h.crc_raw = crc_raw;
  h.codec = ChunkCodec::kRaw;
  h.stored_len = h.raw_len;
  h.crc_stored = h.crc_raw;
  WriteHeader(h, rec);
  return h;
}

ChunkHeader ChunkEncoder::Encode(const uint8_t* raw, size_t n, DType dtype,
                                 uint64_t stream_offset, bool try_compress, uint8_t* out) {
  if (alt_.size() < MaxRecordSize(n)) alt_.resize(MaxRecordSize(n));
  std::memcpy(out + kChunkHeaderSize, raw, n);
  bool in_alt = false;
  ChunkHeader h = EncodeInPlace(out, n, Crc32c(raw, n), dtype, stream_offset, try_compress,
                                alt_.data(), &in_alt);
  if (in_alt) std::memcpy(out, alt_.data(), h.record_len());
  return h;
}

absl::Status ParseChunkHeader(const uint8_t* p, size_t avail, ChunkHeader* h) {
  if (avail < kChunkHeaderSize) return absl::DataLossError("chunk record truncated (header)");
  if (Get32(p) != kChunkMagic) return absl::DataLossError("chunk record: bad magic");
  if (Get32(p + 36) != Crc32c(p, 36)) return absl::DataLossError("chunk record: header CRC");
  if (Get16(p + 4) != kChunkVersion) {
    return absl::DataLossError(absl::StrCat("chunk record: unknown version ", Get16(p + 4)));
  }
  if (p[6] > 1 || p[7] > 1 || p[9] != 0 || p[10] != 0 || p[11] != 0) {
    return absl::DataLossError("chunk record: bad codec/filter");
  }
  h->codec = static_cast<ChunkCodec>(p[6]);
  h->filter = static_cast<ChunkFilter>(p[7]);
  h->element_size = p[8];
  h->raw_len = Get32(p + 12);
  h->stored_len = Get32(p + 16);
  h->stream_offset = Get64(p + 20);
  h->crc_raw = Get32(p + 28);
  h->crc_stored = Get32(p + 32);
  bool bad_width = h->filter == ChunkFilter::kShuffle
                       ? (h->element_size != 2 && h->element_size != 4 && h->element_size != 8)
                       : h->element_size != 1;
  if (bad_width || h->raw_len > kMaxChunkRawBytes ||
      (h->codec == ChunkCodec::kRaw && h->stored_len != h->raw_len) ||
      h->stored_len > ZSTD_compressBound(h->raw_len)) {
    return absl::DataLossError("chunk record: inconsistent header");
  }
  return absl::OkStatus();
}

ChunkDecoder::ChunkDecoder()
    : dctx_(ZSTD_createDCtx(), [](void* d) { ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(d)); }) {}

absl::Status ChunkDecoder::Decode(const uint8_t* rec, size_t rec_len,
                                  const ChunkHeader* expected, uint8_t* out, size_t out_cap) {
  ChunkHeader h;
  if (absl::Status s = ParseChunkHeader(rec, rec_len, &h); !s.ok()) return s;
  if (expected != nullptr && !SameHeader(h, *expected)) {
    return absl::DataLossError("chunk record does not match its metadata");
  }
  if (rec_len < h.record_len()) return absl::DataLossError("chunk record truncated");
  if (out_cap < h.raw_len) return absl::DataLossError("chunk larger than expected");
  const uint8_t* payload = rec + kChunkHeaderSize;
  if (Crc32c(payload, h.stored_len) != h.crc_stored) {
    return absl::DataLossError(kStoredCrcMismatch);
  }
  if (h.codec == ChunkCodec::kRaw) {
    std::memcpy(out, payload, h.raw_len);  // crc_raw == crc_stored was checked above
    return h.crc_raw == h.crc_stored ? absl::OkStatus()
                                     : absl::DataLossError("chunk raw CRC mismatch");
  }
  uint8_t* dst = out;
  if (h.filter == ChunkFilter::kShuffle) {
    if (scratch_.size() < h.raw_len) scratch_.resize(h.raw_len);
    dst = scratch_.data();
  }
  size_t d = ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(dctx_.get()), dst, h.raw_len, payload,
                                 h.stored_len);
  if (ZSTD_isError(d) || d != h.raw_len) return absl::DataLossError("chunk zstd frame corrupt");
  if (h.filter == ChunkFilter::kShuffle) ByteUnshuffle(dst, out, h.raw_len, h.element_size);
  if (Crc32c(out, h.raw_len) != h.crc_raw) return absl::DataLossError("chunk raw CRC mismatch");
  return absl::OkStatus();
}

absl::Status ChunkDecoder::DecodeView(const uint8_t* rec, size_t rec_len,
                                      const ChunkHeader* expected, std::vector<uint8_t>* scratch,
                                      const uint8_t** data, bool* crc_pending) {
  if (crc_pending != nullptr) *crc_pending = false;
  ChunkHeader h;
  if (absl::Status s = ParseChunkHeader(rec, rec_len, &h); !s.ok()) return s;
  if (h.codec == ChunkCodec::kRaw) {
    if (expected != nullptr && !SameHeader(h, *expected)) {
      return absl::DataLossError("chunk record does not match its metadata");
    }
    if (rec_len < h.record_len()) return absl::DataLossError("chunk record truncated");
    if (h.crc_raw != h.crc_stored) return absl::DataLossError(kStoredCrcMismatch);
    if (crc_pending != nullptr) {
      *crc_pending = true;
    } else if (Crc32c(rec + kChunkHeaderSize, h.stored_len) != h.crc_stored) {
      return absl::DataLossError(kStoredCrcMismatch);
    }
    *data = rec + kChunkHeaderSize;
    return absl::OkStatus();
  }
  if (scratch->size() < h.raw_len) scratch->resize(h.raw_len);
  *data = scratch->data();
  return Decode(rec, rec_len, expected, scratch->data(), h.raw_len);
}

}  // namespace storage
}  // namespace gradsnap
