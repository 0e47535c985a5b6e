// Chunk encoding: the unit of storage (docs/format.md, "Chunk record").
//
// A chunk is up to EngineOptions::chunk_bytes of one tensor's raw bytes. Encoding optionally
// byte-shuffles float data (byte plane k of every element stored together, so the exponent
// bytes compress), compresses with zstd when that pays, and frames the result as a record:
// a 40-byte little-endian header (magic, version, codec, filter, lengths, the chunk's offset in
// the shard stream, CRC-32C of the raw and of the stored bytes, CRC-32C of the header) followed
// by the stored bytes. Decoding checks everything and never trusts a length it has not checked.
//
// THREAD SAFETY: ChunkEncoder and ChunkDecoder hold a zstd context and scratch memory; use one
// per thread. The free functions are thread-safe.
#ifndef GRADSNAP_STORAGE_CHUNK_CODEC_H_
#define GRADSNAP_STORAGE_CHUNK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace gradsnap {
namespace storage {

constexpr uint32_t kChunkMagic = 0x4B435347;  // "GSCK" little-endian
constexpr uint16_t kChunkVersion = 1;
constexpr size_t kChunkHeaderSize = 40;
constexpr uint32_t kMaxChunkRawBytes = 64u << 20;
// Chunks up to this size (small tensors, tensor tails) are staged in small record buffers, so
// a writer keeps many of them in flight (ShardWriter, "small chunks").
constexpr size_t kSmallChunkBytes = 256u << 10;

enum class ChunkCodec : uint8_t { kRaw = 0, kZstd = 1 };
enum class ChunkFilter : uint8_t { kNone = 0, kShuffle = 1 };

// What the metadata records about a chunk; also the decoded record header.
struct ChunkHeader {
  ChunkCodec codec = ChunkCodec::kRaw;
  ChunkFilter filter = ChunkFilter::kNone;
  uint8_t element_size = 1;   // shuffle width
  uint32_t raw_len = 0;
  uint32_t stored_len = 0;
  uint64_t stream_offset = 0;  // offset of the chunk's first byte in the shard payload
  uint32_t crc_raw = 0;
  uint32_t crc_stored = 0;
  size_t record_len() const { return kChunkHeaderSize + stored_len; }
};

struct CodecOptions {
  int zstd_level = 1;          // 0: never compress
  bool shuffle = true;
  double max_compressed_ratio = 0.90;
};

// What the adaptive compression policy weighs (docs/format.md, "Compression policy"): speeds
// in raw bytes per second, per core for the codec. 0 means not measured yet.
struct CompressionCosts {
  double encode_bps = 0;  // shuffle + zstd of one core (the writer)
  double decode_bps = 0;  // zstd + unshuffle of one core (a reader)
  double disk_bps = 0;    // the writer's measured segment write rate, also taken as the read rate
  int encoders = 1;       // cores that may compress at once while writing
  int decoders = 1;       // cores that decode while reading
};

// Whether storing chunks compressed to `ratio` (stored / raw, from the probe) can slow neither
// the write nor the later read: the ratio must be at most max_ratio, the encoders together must
// outpace the disk (encoders * encode_bps >= disk_bps: compressed writes then run at
// min(encoders * encode_bps, disk_bps / ratio) >= disk_bps) and so must the decoders on
// restore (decoders * decode_bps >= disk_bps). False while the disk rate is unknown.
// Deterministic: a pure function of its arguments.
bool CompressionPays(const CompressionCosts& c, double ratio, double max_ratio);

// What the last probe of a ChunkEncoder measured (ran == false: no probe).
struct ProbeResult {
  bool ran = false;
  double ratio = 1;       // compressed / raw of the sample
  double encode_bps = 0;  // shuffle + zstd speed on the sample
  double decode_bps = 0;  // zstd + unshuffle speed on the sample
};

// Upper bound of the record size of a chunk of raw_len bytes.
size_t MaxRecordSize(size_t raw_len);

// Byte shuffle / unshuffle with element size `width` (n need not be a multiple; the tail is
// copied as is).
void ByteShuffle(const uint8_t* in, uint8_t* out, size_t n, size_t width);
void ByteUnshuffle(const uint8_t* in, uint8_t* out, size_t n, size_t width);

// Writes the header of a raw (uncompressed, unfiltered) record in front of the n raw bytes at
// rec + kChunkHeaderSize, whose CRC-32C is crc_raw, and returns it.
ChunkHeader WriteRawHeader(uint8_t* rec, size_t n, uint32_t crc_raw, uint64_t stream_offset);

// Bytes of a chunk's start that are compressed first, as a probe: a chunk whose probe does not
// get halfway to max_compressed_ratio (or, with SetCosts, for which CompressionPays() says no)
// is stored raw without compressing the rest (chunks of at least 4 * kCompressProbeBytes).
constexpr size_t kCompressProbeBytes = 64u << 10;

class ChunkEncoder {
 public:
  explicit ChunkEncoder(const CodecOptions& options);
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // Encodes raw[0, n) into out (capacity >= MaxRecordSize(n)) and returns the header; the
  // record is out[0, header.record_len()). `try_compress` false stores the chunk raw (the
  // writer's adaptive bypass); so does a failed probe (kCompressProbeBytes).
  // n <= kMaxChunkRawBytes.
  ChunkHeader Encode(const uint8_t* raw, size_t n, DType dtype, uint64_t stream_offset,
                     bool try_compress, uint8_t* out);
  // The writer's zero-copy variant: the raw bytes already sit at rec + kChunkHeaderSize and
  // crc_raw is their CRC-32C (the writer computes it while copying them in, one pass per
  // byte). If compression pays, the record is built in `alt` (capacity >= MaxRecordSize(n))
  // and *in_alt is set; otherwise the header is written in front of the raw bytes in `rec`.
  ChunkHeader EncodeInPlace(uint8_t* rec, size_t n, uint32_t crc_raw, DType dtype,
                            uint64_t stream_offset, bool try_compress, uint8_t* alt,
                            bool* in_alt);
  // The adaptive policy: from now on the probe also times compressing and decompressing its
  // sample, and a chunk is compressed only if CompressionPays(costs with the probe's speeds).
  // Chunks too small to probe are then stored raw. Without it (default) only the ratio counts.
  void SetCosts(const CompressionCosts& costs) {
    costs_ = costs;
    use_costs_ = true;
  }
  // What the last EncodeInPlace/Encode call's probe measured.
  const ProbeResult& last_probe() const { return probe_; }

 private:
  // Largest compressed size worth storing for n raw bytes.
  size_t Limit(size_t n) const;
  // zstd frame of raw[0, n), byte-shuffled with `width` first when > 1, into out.
  size_t Compress(const uint8_t* raw, size_t n, size_t width, uint8_t* out);
  // The probe: whether raw[0, n) compresses enough to try the whole chunk (out: scratch of at
  // least ZSTD_compressBound(n) bytes). Fills probe_.
  bool Pays(const uint8_t* raw, size_t n, size_t width, uint8_t* out);
  // With SetCosts: times decoding the probe's frame out[0, z) of n bytes (into probe_).
  void TimeDecode(const uint8_t* frame, size_t z, size_t n, size_t width);

  CodecOptions options_;
  CompressionCosts costs_;
  bool use_costs_ = false;
  ProbeResult probe_;
  void* cctx_;  // ZSTD_CCtx*
  void* dctx_ = nullptr;  // ZSTD_DCtx*, for timing the probe's decode (SetCosts)
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> alt_;
  std::vector<uint8_t> probe_out_;  // TimeDecode's output
};

// The DATA_LOSS message of a record whose payload does not match its CRC-32C.
inline constexpr char kStoredCrcMismatch[] = "chunk stored-bytes CRC mismatch";

// Parses and checks a record header (magic, version, header CRC, enum values, lengths).
// DATA_LOSS on any mismatch.
absl::Status ParseChunkHeader(const uint8_t* rec, size_t avail, ChunkHeader* out);

class ChunkDecoder {
 public:
  ChunkDecoder();  // movable, not copyable

  // Decodes the record rec[0, rec_len) into out[0, header.raw_len). If `expected` is given, the
  // record header must equal it field by field. Verifies both CRCs. DATA_LOSS on any failure;
  // `out` may then hold garbage.
  absl::Status Decode(const uint8_t* rec, size_t rec_len, const ChunkHeader* expected,
                      uint8_t* out, size_t out_cap);
  // Zero-copy variant: checks the record like Decode(); a raw record's bytes are left in
  // place (*data = rec + kChunkHeaderSize), a compressed one is decoded into *scratch.
  // With `crc_pending` given, a raw record's payload CRC is not computed: *crc_pending is set
  // and the caller must check Crc32c(*data, raw_len) == header.crc_raw before using a byte
  // (the shard reader does it in the same pass as the tensor digests). Everything else (the
  // header, its CRC and its match with `expected`, the length, a compressed record's CRCs) is
  // checked here; *crc_pending is false for a compressed record.
  absl::Status DecodeView(const uint8_t* rec, size_t rec_len, const ChunkHeader* expected,
                          std::vector<uint8_t>* scratch, const uint8_t** data,
                          bool* crc_pending = nullptr);

 private:
  std::unique_ptr<void, void (*)(void*)> dctx_;  // ZSTD_DCtx*
  std::vector<uint8_t> scratch_;
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_CHUNK_CODEC_H_
