// Many small tensors: packed into shared chunks (format 3, docs/format.md "Packed chunks"),
// or with packing off each a chunk of its own staged in a small record buffer (the format-2
// layout). All come back byte-exact and verified, with io_uring and with the pwrite path, with
// larger tensors, empty ones and mixed dtypes in between; a corrupt packed chunk is DATA_LOSS
// for exactly the tensors in it; a writer resumes inside a packed chunk; format-2 stores read.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "storage/chunk_codec.h"
#include "storage/engine.h"
#include "storage/file_system.h"
#include "storage/footer.h"
#include "storage/metadata.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

namespace fs = std::filesystem;

// Small tensors of mixed dtypes and sizes (1 element to 64 KiB), with empty tensors and
// tensors too large to pack in between.
ShardData MixedSmallShard(const std::string& job, int64_t step, int count, uint64_t seed) {
  ShardData d;
  d.spec.job = job;
  d.spec.step = step;
  d.spec.rank = 0;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < count; ++i) {
    DType dt = i % 5 == 1 ? DType::kBF16 : i % 7 == 3 ? DType::kI64 : DType::kF32;
    int64_t numel = i % 13 == 12  ? 0
                    : i % 17 == 9 ? 70000 + i  // above kSmallChunkBytes: never packed
                                  : 1 + static_cast<int64_t>(rng() % (16384));
    d.spec.tensors.push_back(Tensor(absl::StrCat("t", i), dt, numel));
    const size_t bytes = static_cast<size_t>(numel) * DTypeSize(dt);
    d.bytes.push_back(i % 3 == 0 && dt == DType::kF32 ? WeightBytes(numel, seed + i)
                                                      : RandomBytes(bytes, seed + i));
  }
  return d;
}

// The chunk records of the shard's committed footer (the last segment file).
std::vector<ChunkRecord> FooterChunks(const std::string& dir, const std::string& job,
                                      int64_t step, std::string* segment_dir) {
  *segment_dir = absl::StrCat(dir, "/segments/", job, "/", absl::StrFormat("%020d", step));
  std::string last;
  for (const auto& e : fs::directory_iterator(*segment_dir)) {
    last = std::max(last, e.path().string());
  }
  auto f = ReadFooter(FileSystem::Default(), last);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? f->chunks : std::vector<ChunkRecord>{};
}

size_t PackedChunks(const std::vector<ChunkRecord>& chunks) {
  size_t n = 0;
  for (const ChunkRecord& c : chunks) n += c.members.empty() ? 0 : 1;
  return n;
}

// Writes d as a one-shard FULL checkpoint.
void WriteFull(Engine* e, const ShardData& d) {
  const CheckpointSpec c{d.spec.job, d.spec.step, CheckpointKind::kFull, -1, 1, ""};
  ASSERT_TRUE(e->BeginCheckpoint(c).ok());
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
}

// The same through an engine of its own, closed again (the files are then left alone).
void WriteFullAndClose(const EngineOptions& o, const ShardData& d) {
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status();
  WriteFull(e->get(), d);
}

class SmallChunksTest : public ::testing::TestWithParam<bool> {
 protected:
  EngineOptions Options() const {
    EngineOptions o;
    o.data_dir = dir_.path();
    o.use_io_uring = GetParam();
    return o;
  }
  TempDir dir_;
};

TEST_P(SmallChunksTest, PackedSmallTensorsRoundTrip) {
  EngineOptions o = Options();
  o.pack_bytes = 256 << 10;  // several packed chunks
  o.adapt_compression = false;  // every chunk tries compression, mixed dtypes too
  ShardData d = MixedSmallShard("pk", 1, 400, 11);
  {
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    WriteFull(e->get(), d);
    ExpectRestores(e->get(), d);
    EXPECT_TRUE((*e)->Verify("pk", 1).ok());
    // Packed: far fewer chunks than tensors, and records not padded per tensor.
    auto m = (*e)->GetManifest("pk", 1);
    ASSERT_TRUE(m.ok()) << m.status();
    uint64_t raw = m->shards[0].raw_bytes;
    EXPECT_LT(m->shards[0].stored_bytes, raw + raw / 8);
  }
  std::string seg_dir;
  std::vector<ChunkRecord> chunks = FooterChunks(dir_.path(), "pk", 1, &seg_dir);
  EXPECT_GT(PackedChunks(chunks), 5u);
  EXPECT_LT(chunks.size(), d.spec.tensors.size() / 4);
}

// A corrupt byte in one packed chunk: exactly the tensors in it are DATA_LOSS, every other
// tensor still reads, Verify fails.
TEST_P(SmallChunksTest, CorruptPackedChunkLosesExactlyItsTensors) {
  EngineOptions o = Options();
  o.pack_bytes = 128 << 10;
  o.zstd_level = 0;
  ShardData d = MixedSmallShard("cp", 1, 200, 5);
  WriteFullAndClose(o, d);
  std::string seg_dir;
  std::vector<ChunkRecord> chunks = FooterChunks(dir_.path(), "cp", 1, &seg_dir);
  std::vector<const ChunkRecord*> packed;
  for (const ChunkRecord& c : chunks) {
    if (c.members.size() >= 3) packed.push_back(&c);
  }
  ASSERT_GE(packed.size(), 2u);
  const ChunkRecord& victim = *packed[packed.size() / 2];
  std::set<uint32_t> lost;
  for (const ChunkMember& m : victim.members) lost.insert(m.tensor);
  {
    const std::string seg = absl::StrCat(seg_dir, "/", SegmentFileName(0, victim.segment));
    int fd = ::open(seg.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << seg;
    const off_t at = static_cast<off_t>(victim.offset + kChunkHeaderSize + victim.header.raw_len / 2);
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
    ::close(fd);
  }
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status();
  auto r = (*e)->OpenShardReader("cp", 1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t i = 0; i < d.bytes.size(); ++i) {
    std::vector<uint8_t> out(d.bytes[i].size());
    absl::Status s = (*r)->ReadTensor(i, out.data(), out.size());
    if (lost.count(static_cast<uint32_t>(i)) != 0) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "tensor " << i << ": " << s;
      EXPECT_NE(s.message().find(d.spec.tensors[i].name), std::string::npos) << s;
    } else {
      EXPECT_TRUE(s.ok()) << "tensor " << i << ": " << s;
      EXPECT_EQ(out, d.bytes[i]) << "tensor " << i;
    }
  }
  EXPECT_EQ((*e)->Verify("cp", 1).code(), absl::StatusCode::kDataLoss);
}

// A Flush inside a packed chunk, then a new writer (a resumed upload): the durable part of the
// half-written small tensor lies in a packed chunk and is re-read to rebuild its digest.
TEST_P(SmallChunksTest, ResumeInsidePackedChunk) {
  EngineOptions o = Options();
  ShardData d = MixedSmallShard("rs", 1, 60, 9);
  const std::vector<uint8_t> stream = d.stream();
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->BeginCheckpoint({"rs", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  // Stop in the middle of tensor 20 (small, not empty).
  uint64_t cut = 0;
  for (int i = 0; i < 20; ++i) cut += d.bytes[i].size();
  ASSERT_GT(d.bytes[20].size(), 2u);
  cut += d.bytes[20].size() / 2;
  {
    auto w = (*e)->OpenShardWriter(d.spec);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(stream.data(), cut).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  auto w = (*e)->OpenShardWriter(d.spec);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->committed_size(), cut);
  ASSERT_TRUE((*w)->Append(stream.data() + cut, stream.size() - cut).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  w->reset();
  ExpectRestores(e->get(), d);
  EXPECT_TRUE((*e)->Verify("rs", 1).ok());
}

// pack_bytes = 0 writes the format-2 layout (every chunk record of one tensor, version 1);
// an engine that packs reads that store, and a store holding both layouts.
TEST_P(SmallChunksTest, Format2LayoutStillReads) {
  EngineOptions o = Options();
  o.pack_bytes = 0;
  ShardData old_layout = MixedSmallShard("v2", 1, 120, 3);
  WriteFullAndClose(o, old_layout);
  std::string seg_dir;
  EXPECT_EQ(PackedChunks(FooterChunks(dir_.path(), "v2", 1, &seg_dir)), 0u);
  auto e = Engine::Open(Options());  // packs (the default)
  ASSERT_TRUE(e.ok()) << e.status();
  ShardData packed = MixedSmallShard("v2", 2, 120, 4);
  WriteFull(e->get(), packed);
  EXPECT_GT(PackedChunks(FooterChunks(dir_.path(), "v2", 2, &seg_dir)), 0u);
  ExpectRestores(e->get(), old_layout);
  ExpectRestores(e->get(), packed);
  EXPECT_TRUE((*e)->Verify("v2", 1).ok());
  EXPECT_TRUE((*e)->Verify("v2", 2).ok());
}

// Packed (the default), and each small tensor a chunk of its own in a small record buffer,
// many in flight at once (pack_bytes = 0; shard_writer.cc, kSmallJobsPerJob).
TEST_P(SmallChunksTest, ManySmallTensorsRoundTrip) {
  for (size_t pack : {EngineOptions().pack_bytes, size_t{0}}) {
    EngineOptions o = Options();
    o.pack_bytes = pack;
    o.zstd_level = 1;
    o.adapt_compression = false;  // every chunk tries compression: small alt buffers too
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    ShardData d;
    d.spec.job = "sc";
    d.spec.step = pack == 0 ? 2 : 1;
    d.spec.rank = 0;
    std::mt19937_64 rng(7);
    for (int i = 0; i < 600; ++i) {
      // Mostly 4 B-256 KiB, exactly the small-buffer limit, and every 50th above it.
      int64_t numel = i % 50 == 49 ? 300000 + i
                      : i % 50 == 48 ? static_cast<int64_t>(kSmallChunkBytes / 4)
                                     : 1 + static_cast<int64_t>(rng() % (kSmallChunkBytes / 4));
      d.spec.tensors.push_back(Tensor(absl::StrCat("t", i), DType::kF32, numel));
      d.bytes.push_back(i % 3 == 0 ? WeightBytes(numel, i) : RandomBytes(numel * 4, i));
    }
    WriteFull(e->get(), d);
    ExpectRestores(e->get(), d);
    EXPECT_TRUE((*e)->Verify("sc", d.spec.step).ok());
  }
}

// Packed ChunkRecords round-trip; a member list that does not tile its chunk, or places a
// tensor where the spec does not, is DATA_LOSS; single-tensor records stay version 1.
TEST(PackedRecordTest, EncodingAndPlacement) {
  const std::vector<uint64_t> starts = {0, 100, 100, 250, 1000};  // t1 is empty
  ChunkRecord c;
  c.header.raw_len = 250;
  c.header.stream_offset = 0;
  c.tensor = 0;
  c.members = {{0, 0, 100}, {2, 100, 150}};
  ChunkRecord back;
  ASSERT_TRUE(DecodeChunk(EncodeChunk(c), &back).ok());
  ASSERT_EQ(back.members.size(), 2u);
  EXPECT_EQ(back.members[1].tensor, 2u);
  EXPECT_EQ(back.members[1].offset, 100u);
  EXPECT_EQ(back.members[1].length, 150u);
  EXPECT_EQ(EncodeChunk(c)[0], 2);
  EXPECT_TRUE(CheckChunkPlacement(starts, c).ok());

  auto misplaced = [&](ChunkRecord bad) {
    return CheckChunkPlacement(starts, bad).code() == absl::StatusCode::kDataLoss;
  };
  ChunkRecord gap = c;
  gap.members[1].offset = 101;
  EXPECT_TRUE(misplaced(gap));
  ChunkRecord wrong_tensor = c;
  wrong_tensor.members[1].tensor = 3;  // t3 starts at 250, not 100
  EXPECT_TRUE(misplaced(wrong_tensor));
  ChunkRecord short_tiling = c;
  short_tiling.header.raw_len = 300;
  EXPECT_TRUE(misplaced(short_tiling));
  ChunkRecord first_differs = c;
  first_differs.tensor = 2;
  EXPECT_TRUE(misplaced(first_differs));

  ChunkRecord single;
  single.header.raw_len = 500;
  single.header.stream_offset = 300;
  single.tensor = 3;
  EXPECT_EQ(EncodeChunk(single)[0], 1);
  EXPECT_TRUE(CheckChunkPlacement(starts, single).ok());
  single.tensor = 2;
  EXPECT_TRUE(misplaced(single));

  // A version-2 record must list at least two members.
  ChunkRecord one = c;
  one.members.resize(1);
  std::string v = EncodeChunk(one);
  EXPECT_EQ(DecodeChunk(v, &back).code(), absl::StatusCode::kDataLoss);
}

INSTANTIATE_TEST_SUITE_P(IoPaths, SmallChunksTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "io_uring" : "pwrite";
                         });

}  // namespace
}  // namespace storage
}  // namespace gradsnap
