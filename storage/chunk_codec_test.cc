// Chunk codec: round trips over random sizes and dtypes; the decoder on random and mutated
// bytes never crashes and never reports success on damaged data.
#include "storage/chunk_codec.h"

#include <random>

#include "gtest/gtest.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                        DType::kI32, DType::kI64,  DType::kU8};

std::vector<uint8_t> Sample(size_t n, int flavor, uint64_t seed) {
  switch (flavor) {
    case 0: return RandomBytes(n, seed);
    case 1: return std::vector<uint8_t>(n, static_cast<uint8_t>(seed));
    default: {
      auto w = WeightBytes(n / 4 + 1, seed);
      w.resize(n);
      return w;
    }
  }
}

TEST(ShuffleTest, InvertsForEveryWidthAndLength) {
  for (size_t width : {1, 2, 4, 8, 3}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 4096, 10001, 65536 + 24}) {
      auto in = RandomBytes(n, n * 31 + width);
      std::vector<uint8_t> mid(n), out(n);
      ByteShuffle(in.data(), mid.data(), n, width);
      ByteUnshuffle(mid.data(), out.data(), n, width);
      EXPECT_EQ(in, out) << "width " << width << " n " << n;
    }
  }
  // Plane layout: for width 2, all low bytes first.
  std::vector<uint8_t> in = {1, 2, 3, 4}, out(4);
  ByteShuffle(in.data(), out.data(), 4, 2);
  EXPECT_EQ(out, (std::vector<uint8_t>{1, 3, 2, 4}));
  // The vector paths against the definition, for widths 2 and 4 and lengths with tails.
  for (size_t width : {2, 4, 8}) {
    for (size_t n : {size_t{16 * 8 * 3 + 5}, size_t{1000}, size_t{4096}}) {
      auto src = RandomBytes(n, n + width);
      std::vector<uint8_t> got(n), want(n);
      size_t elems = n / width;
      for (size_t p = 0; p < width; ++p) {
        for (size_t i = 0; i < elems; ++i) want[p * elems + i] = src[i * width + p];
      }
      for (size_t i = elems * width; i < n; ++i) want[i] = src[i];
      ByteShuffle(src.data(), got.data(), n, width);
      EXPECT_EQ(got, want) << "width " << width << " n " << n;
    }
  }
}

TEST(ChunkCodecTest, RoundTripsRandomSizesAndTypes) {
  std::mt19937_64 rng(42);
  ChunkDecoder dec;
  for (int iter = 0; iter < 300; ++iter) {
    CodecOptions o;
    o.zstd_level = static_cast<int>(rng() % 4);
    o.shuffle = rng() % 2;
    ChunkEncoder enc(o);
    DType t = kTypes[rng() % 7];
    size_t n = rng() % 3 == 0 ? rng() % 100 : rng() % (300 << 10);
    auto raw = Sample(n, static_cast<int>(rng() % 3), rng());
    std::vector<uint8_t> rec(MaxRecordSize(n));
    uint64_t off = rng();
    ChunkHeader h = enc.Encode(raw.data(), n, t, off, rng() % 4 != 0, rec.data());
    ASSERT_EQ(h.raw_len, n);
    ASSERT_LE(h.record_len(), rec.size());
    EXPECT_EQ(h.stream_offset, off);
    if (h.codec == ChunkCodec::kZstd) {
      EXPECT_LE(h.stored_len, n * o.max_compressed_ratio);
    }
    std::vector<uint8_t> out(n + 1, 0xEE);
    ASSERT_TRUE(dec.Decode(rec.data(), h.record_len(), &h, out.data(), out.size()).ok());
    out.resize(n);
    ASSERT_EQ(out, raw) << "iter " << iter;
    ASSERT_TRUE(dec.Decode(rec.data(), h.record_len(), nullptr, out.data(), n).ok());
    std::vector<uint8_t> scratch;
    const uint8_t* view = nullptr;
    ASSERT_TRUE(dec.DecodeView(rec.data(), h.record_len(), &h, &scratch, &view).ok());
    ASSERT_EQ(0, n == 0 ? 0 : std::memcmp(view, raw.data(), n));
  }
}

TEST(ChunkCodecTest, CompressesConstantAndBypassesNoise) {
  ChunkEncoder enc(CodecOptions{});
  auto zeros = std::vector<uint8_t>(1 << 20, 0);
  std::vector<uint8_t> rec(MaxRecordSize(zeros.size()));
  EXPECT_EQ(enc.Encode(zeros.data(), zeros.size(), DType::kF32, 0, true, rec.data()).codec,
            ChunkCodec::kZstd);
  auto noise = RandomBytes(1 << 20, 5);
  ChunkHeader h = enc.Encode(noise.data(), noise.size(), DType::kF32, 0, true, rec.data());
  EXPECT_EQ(h.codec, ChunkCodec::kRaw);
  EXPECT_EQ(h.stored_len, h.raw_len);
  auto w = WeightBytes(1 << 18, 9);
  h = enc.Encode(w.data(), w.size(), DType::kF32, 0, true, rec.data());
  EXPECT_EQ(h.filter, ChunkFilter::kShuffle);
}

// Every single-byte change anywhere in a record is detected.
// The policy's arithmetic: compress only when encoders and decoders both outpace the disk and
// the ratio is at most the limit.
TEST(CompressionPolicyTest, PaysOnlyWhenCodecOutpacesDisk) {
  CompressionCosts c{/*encode_bps=*/400e6, /*decode_bps=*/1.5e9, /*disk_bps=*/200e6,
                     /*encoders=*/1, /*decoders=*/1};
  EXPECT_TRUE(CompressionPays(c, 0.35, 0.9));   // slow disk: hidden on both sides
  EXPECT_TRUE(CompressionPays(c, 0.9, 0.9));    // at the limit
  EXPECT_FALSE(CompressionPays(c, 0.91, 0.9));  // above it
  c.disk_bps = 2e9;                             // fast disk: one encoder cannot keep up
  EXPECT_FALSE(CompressionPays(c, 0.35, 0.9));
  c.encoders = 5;                               // five can (2.0 GB/s) but one decoder cannot
  EXPECT_FALSE(CompressionPays(c, 0.35, 0.9));
  c.decoders = 2;                               // 3 GB/s of decoding: both sides keep up
  EXPECT_TRUE(CompressionPays(c, 0.35, 0.9));
  c.disk_bps = 0;                               // not measured yet
  EXPECT_FALSE(CompressionPays(c, 0.35, 0.9));
  c.disk_bps = 1e9;
  c.encode_bps = 0;                             // no probe speed
  EXPECT_FALSE(CompressionPays(c, 0.35, 0.9));
}

// With costs set, the encoder's probe measures real codec speeds; a disk far slower than any
// codec (1 KB/s) makes compressible chunks compress, one far faster (1 PB/s) keeps them raw.
// The margins are many orders of magnitude, so the outcome does not depend on the machine.
TEST(CompressionPolicyTest, EncoderFollowsTheCostModel) {
  CodecOptions co;
  // 1 MiB of fp32 weights with bf16 precision (low mantissa bytes zero): compresses to ~0.5.
  std::vector<uint8_t> w = WeightBytes(1 << 18, 9);
  for (size_t i = 0; i < w.size(); i += 4) w[i] = w[i + 1] = 0;
  std::vector<uint8_t> rec(MaxRecordSize(w.size()));
  for (double disk : {1e3, 1e15, 0.0}) {
    ChunkEncoder enc(co);
    enc.SetCosts(CompressionCosts{0, 0, disk, 1, 1});
    ChunkHeader h = enc.Encode(w.data(), w.size(), DType::kF32, 0, true, rec.data());
    EXPECT_EQ(h.codec, disk == 1e3 ? ChunkCodec::kZstd : ChunkCodec::kRaw) << disk;
    EXPECT_TRUE(enc.last_probe().ran);
    EXPECT_GT(enc.last_probe().encode_bps, 0);
    EXPECT_GT(enc.last_probe().decode_bps, 0);
    EXPECT_LT(enc.last_probe().ratio, 0.95);
    std::vector<uint8_t> out(w.size());
    ChunkDecoder dec;
    ASSERT_TRUE(dec.Decode(rec.data(), h.record_len(), &h, out.data(), out.size()).ok());
    EXPECT_EQ(out, w);
  }
  // A chunk too small to probe is stored raw under the model; without it, it compresses.
  const std::vector<uint8_t> zeros(64 << 10, 0);
  ChunkEncoder modeled(co);
  modeled.SetCosts(CompressionCosts{0, 0, 1e3, 1, 1});
  EXPECT_EQ(modeled.Encode(zeros.data(), zeros.size(), DType::kF32, 0, true, rec.data()).codec,
            ChunkCodec::kRaw);
  EXPECT_FALSE(modeled.last_probe().ran);
  ChunkEncoder plain(co);
  EXPECT_EQ(plain.Encode(zeros.data(), zeros.size(), DType::kF32, 0, true, rec.data()).codec,
            ChunkCodec::kZstd);
}

TEST(ChunkCodecTest, EveryMutationIsDetected) {
  ChunkDecoder dec;
  for (int level : {0, 1}) {
    CodecOptions o;
    o.zstd_level = level;
    ChunkEncoder enc(o);
    auto raw = WeightBytes(600, level + 1);
    std::vector<uint8_t> rec(MaxRecordSize(raw.size()));
    ChunkHeader h = enc.Encode(raw.data(), raw.size(), DType::kF32, 77, true, rec.data());
    rec.resize(h.record_len());
    std::vector<uint8_t> out(raw.size());
    std::mt19937_64 rng(level);
    for (size_t i = 0; i < rec.size(); ++i) {
      for (uint8_t flip : {uint8_t{1}, uint8_t{0x80}, static_cast<uint8_t>(rng() | 1)}) {
        auto bad = rec;
        bad[i] ^= flip;
        absl::Status s = dec.Decode(bad.data(), bad.size(), nullptr, out.data(), out.size());
        ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << i << " level " << level;
        std::vector<uint8_t> scratch;
        const uint8_t* view = nullptr;
        ASSERT_EQ(dec.DecodeView(bad.data(), bad.size(), nullptr, &scratch, &view).code(),
                  absl::StatusCode::kDataLoss);
      }
    }
    // Truncation at every length.
    for (size_t len = 0; len < rec.size(); ++len) {
      ASSERT_FALSE(dec.Decode(rec.data(), len, nullptr, out.data(), out.size()).ok());
    }
    // A record that is intact but not the one the metadata describes.
    ChunkHeader other = h;
    other.stream_offset += 1;
    EXPECT_EQ(dec.Decode(rec.data(), rec.size(), &other, out.data(), out.size()).code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(ChunkCodecTest, RandomBytesNeverDecode) {
  ChunkDecoder dec;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> out(1 << 16);
  for (int i = 0; i < 20000; ++i) {
    auto junk = RandomBytes(rng() % 2000, rng());
    if (junk.size() >= 4 && i % 2 == 0) {  // get past the magic check half of the time
      uint32_t m = kChunkMagic;
      std::memcpy(junk.data(), &m, 4);
    }
    ASSERT_FALSE(dec.Decode(junk.data(), junk.size(), nullptr, out.data(), out.size()).ok());
  }
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
