// Engine basics: write, list, manifest, read back, verify, resume, bad input, delete, GC.
#include "storage/engine.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "storage/storage_stats.h"
#include "storage/test_util.h"
#include "tests/testing/gtest_util.h"

namespace gradsnap {
namespace storage {
namespace {

struct Param {
  bool io_uring;
  int zstd_level;
  int encode_threads;
};

class EngineTest : public ::testing::TestWithParam<Param> {
 protected:
  EngineOptions Options() {
    EngineOptions o;
    o.data_dir = dir_.path();
    o.use_io_uring = GetParam().io_uring;
    o.zstd_level = GetParam().zstd_level;
    o.encode_threads = GetParam().encode_threads;
    o.chunk_bytes = 64 << 10;  // many chunks per tensor
    o.adapt_compression = false;
    return o;
  }
  std::unique_ptr<Engine> OpenEngine() {
    return gradsnap::testing::ValueOrNull(Engine::Open(Options()));
  }
  TempDir dir_;
};

TEST_P(EngineTest, WriteListReadVerify) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  int64_t chunks_before = StorageStats::Get().chunks_written->Value();
  CheckpointSpec c{"job1", 10, CheckpointKind::kFull, -1, 2, "ckpt-meta"};
  ASSERT_TRUE(e->BeginCheckpoint(c).ok());
  ASSERT_TRUE(e->BeginCheckpoint(c).ok());  // idempotent
  ShardData s0 = MakeShard("job1", 10, 0, 1), s1 = MakeShard("job1", 10, 1, 2);
  ASSERT_TRUE(e->WriteShard(s0.spec, s0.ptrs()).ok());
  auto list = e->ListCheckpoints("job1");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty()) << "one of two shards must not list";
  EXPECT_EQ(e->ListCheckpoints("job1", true)->size(), 1u);
  EXPECT_EQ(e->OpenShardReader("job1", 10, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(e->WriteShard(s1.spec, s1.ptrs()).ok());
  list = e->ListCheckpoints("job1");
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].state, CheckpointState::kCommitted);
  EXPECT_EQ((*list)[0].metadata, "ckpt-meta");
  EXPECT_EQ((*e->ListJobs()), std::vector<std::string>{"job1"});
  auto m = e->GetManifest("job1", 10);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->shards.size(), 2u);
  EXPECT_TRUE(m->shards[1].committed);
  EXPECT_EQ(m->shards[1].digest_algo, DigestAlgo::kXxh3_128);  // the default
  EXPECT_EQ(m->shards[1].tensors[2].digest_algo, DigestAlgo::kXxh3_128);
  EXPECT_EQ(m->shards[1].tensors[2].digest,
            DigestHex(DigestAlgo::kXxh3_128, s1.bytes[2].data(), s1.bytes[2].size()));
  EXPECT_EQ(m->shards[1].tensors[2].spec.sha256, "");  // none was expected
  EXPECT_GT(m->shards[0].tensors[0].chunks, 1u);
  EXPECT_TRUE(e->Verify("job1", 10).ok());
  ExpectRestores(e.get(), s0);
  ExpectRestores(e.get(), s1);
  // A restarted attempt beginning the committed step again: idempotent for the same spec.
  EXPECT_TRUE(e->BeginCheckpoint(c).ok());
  CheckpointSpec other = c;
  other.metadata = "other";
  EXPECT_EQ(e->BeginCheckpoint(other).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_GE(StorageStats::Get().chunks_written->Value() - chunks_before,
            m->shards[0].tensors[0].chunks + m->shards[1].tensors[0].chunks);
  // A second engine on the same directory is refused while this one is open.
  EXPECT_EQ(Engine::Open(Options()).status().code(), absl::StatusCode::kFailedPrecondition);

  e.reset();
  e = OpenEngine();
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->Verify("job1", 10).ok());
  ExpectRestores(e.get(), s1);
}

TEST_P(EngineTest, ResumeAfterFlush) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->BeginCheckpoint({"j", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d = MakeShard("j", 1, 0, 7);
  std::vector<uint8_t> stream;
  for (const auto& b : d.bytes) stream.insert(stream.end(), b.begin(), b.end());
  uint64_t cut = 150001;  // mid-tensor
  {
    auto w = e->OpenShardWriter(d.spec);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(stream.data(), cut).ok());
    ASSERT_TRUE((*w)->Flush().ok());
    EXPECT_EQ((*w)->committed_size(), cut);
    ASSERT_TRUE((*w)->Append(stream.data() + cut, 1000).ok());  // lost: never flushed
  }
  e.reset();
  e = OpenEngine();
  EXPECT_EQ(*e->ShardCommittedSize("j", 1, 0), cut);
  auto w = e->OpenShardWriter(d.spec);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->committed_size(), cut);
  ASSERT_TRUE((*w)->Append(stream.data() + cut, stream.size() - cut).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  ASSERT_TRUE((*w)->Finish().ok());
  w->reset();
  EXPECT_TRUE(e->Verify("j", 1).ok());
  ExpectRestores(e.get(), d);
}

TEST_P(EngineTest, ConcurrentShards) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  constexpr int kRanks = 4;
  ASSERT_TRUE(e->BeginCheckpoint({"cj", 5, CheckpointKind::kFull, -1, kRanks, ""}).ok());
  std::vector<ShardData> shards;
  for (int r = 0; r < kRanks; ++r) shards.push_back(MakeShard("cj", 5, r, 100 + r));
  std::vector<std::thread> threads;
  std::vector<absl::Status> st(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { st[r] = e->WriteShard(shards[r].spec, shards[r].ptrs()); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
  ASSERT_EQ(e->ListCheckpoints("cj")->size(), 1u);
  EXPECT_TRUE(e->Verify("cj", 5).ok());
  for (const auto& s : shards) ExpectRestores(e.get(), s);
}

// Bytes lent by ReadShared stay intact while held: the reader reuses no held chunk for later
// chunks, and the holds outlive the reader.
TEST_P(EngineTest, ReadSharedBytesOutliveLaterReadsAndTheReader) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->BeginCheckpoint({"rs", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d = MakeShard("rs", 1, 0, 11, 2000000);  // 8 MB: more chunks than the window
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  std::vector<uint8_t> stream;
  for (const auto& b : d.bytes) stream.insert(stream.end(), b.begin(), b.end());
  auto r = e->OpenShardReader("rs", 1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  struct Lent {
    const uint8_t* data;
    size_t size;
    std::shared_ptr<const void> hold;
  };
  std::vector<Lent> lent;
  uint64_t offset = 0;
  while (offset < stream.size()) {
    Lent l{nullptr, 0, nullptr};
    auto got = (*r)->ReadShared(offset, 100000, &l.data, &l.hold);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_GT(*got, 0u) << "at " << offset;
    ASSERT_NE(l.hold, nullptr);
    l.size = *got;
    offset += *got;
    lent.push_back(std::move(l));
  }
  EXPECT_GT(lent.size(), 70u) << "more chunks than the 64-chunk read-ahead window";
  r->reset();  // the holds keep the chunks alive
  offset = 0;
  for (const Lent& l : lent) {
    ASSERT_EQ(0, std::memcmp(l.data, stream.data() + offset, l.size)) << "at " << offset;
    offset += l.size;
  }
  // Once the holds are dropped, a new reader reads the same bytes (slots are reused).
  lent.clear();
  r = e->OpenShardReader("rs", 1, 0);
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> back(stream.size());
  auto got = (*r)->Read(0, back.data(), back.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, stream.size());
  EXPECT_EQ(back, stream);
}

// Readers take their chunk buffers from the engine's record pool and give them back when
// destroyed, except those whose bytes ReadShared lent out: later writes and reads through the
// same engine (which take pool buffers) must not touch bytes still lent.
TEST_P(EngineTest, LentBytesSurviveLaterWritesAndReadsThatReuseBuffers) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->BeginCheckpoint({"lb", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d = MakeShard("lb", 1, 0, 21, 500000);
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  std::vector<uint8_t> stream;
  for (const auto& b : d.bytes) stream.insert(stream.end(), b.begin(), b.end());
  std::vector<std::pair<const uint8_t*, size_t>> views;
  std::vector<std::shared_ptr<const void>> holds;
  {
    auto r = e->OpenShardReader("lb", 1, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    for (uint64_t offset = 0; offset < stream.size();) {
      const uint8_t* data = nullptr;
      std::shared_ptr<const void> hold;
      auto got = (*r)->ReadShared(offset, 50000, &data, &hold);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_GT(*got, 0u);
      views.emplace_back(data, *got);
      holds.push_back(std::move(hold));
      offset += *got;
    }
  }
  // Every chunk of another checkpoint goes through pool buffers, written then read twice.
  ASSERT_TRUE(e->BeginCheckpoint({"lb", 2, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData other = MakeShard("lb", 2, 0, 22, 500000);
  ASSERT_TRUE(e->WriteShard(other.spec, other.ptrs()).ok());
  ExpectRestores(e.get(), other);
  ExpectRestores(e.get(), other);
  uint64_t offset = 0;
  for (const auto& [data, size] : views) {
    ASSERT_EQ(0, std::memcmp(data, stream.data() + offset, size)) << "at " << offset;
    offset += size;
  }
  EXPECT_EQ(offset, stream.size());
}

// A chunk buffer ReadShared lent out goes back to the engine's record pool when its last holder
// lets go, also after the reader is gone: the next reader reads into that same buffer instead
// of faulting a fresh one. The bytes stay intact while held (the pool does not hand out a
// buffer still held).
TEST_P(EngineTest, ReleasedLentBufferGoesBackToThePoolAndIsReused) {
  EngineOptions o = Options();
  o.zstd_level = 0;  // the chunk's bytes lie in its record buffer, not a decompressed copy
  auto e = gradsnap::testing::ValueOrNull(Engine::Open(o));
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->BeginCheckpoint({"lp", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d = MakeShard("lp", 1, 0, 41, 100000);  // 400 KB: several full 64 KiB chunks
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  const std::vector<uint8_t>& w = d.bytes[0];
  const uint8_t* first = nullptr;
  std::shared_ptr<const void> hold;
  {
    auto r = e->OpenShardReader("lp", 1, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    auto got = (*r)->ReadShared(0, 1000, &first, &hold);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, 1000u);
  }
  // The reader's other buffers went back to the pool; the held one did not.
  ExpectRestores(e.get(), d);
  ASSERT_EQ(0, std::memcmp(first, w.data(), 1000));
  hold.reset();  // the last holder: the buffer goes back to the pool, on top
  auto r = e->OpenShardReader("lp", 1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  const uint8_t* again = nullptr;
  auto got = (*r)->ReadShared(0, 1000, &again, &hold);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, 1000u);
  EXPECT_EQ(again, first) << "the first chunk is read into the released buffer";
  EXPECT_EQ(0, std::memcmp(again, w.data(), 1000));
}

// A shard written with chunks larger than the reading engine's chunk_bytes (so its records do
// not fit the engine's pool buffers) reads back, also with a second reader.
TEST_P(EngineTest, RecordsLargerThanThePoolBuffersRead) {
  EngineOptions big = Options();
  big.chunk_bytes = 1 << 20;
  ShardData d = MakeShard("big", 1, 0, 31, 1000000);
  {
    auto e = Engine::Open(big);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->BeginCheckpoint({"big", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
    ASSERT_TRUE((*e)->WriteShard(d.spec, d.ptrs()).ok());
  }
  auto e = OpenEngine();  // chunk_bytes 64 KiB
  ASSERT_NE(e, nullptr);
  ExpectRestores(e.get(), d);
  ExpectRestores(e.get(), d);
  EXPECT_TRUE(e->Verify("big", 1).ok());
}

// Specs a library user can pass that the wire's checks would have caught: a flat slice whose
// offset wraps around, a shard whose tensors sum past 64 bits, and a compression ratio that is
// not a ratio. Each is INVALID_ARGUMENT naming the problem, at open.
TEST(EngineValidationTest, OverflowingSpecsAndOptionsAreRefused) {
  TempDir dir;
  EngineOptions o;
  o.data_dir = dir.path();
  for (double bad : {0.0, -1.0, 1.5, std::nan("")}) {
    EngineOptions b = o;
    b.max_compressed_ratio = bad;
    auto e = Engine::Open(b);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  o.queue_depth = 0;
  auto e = Engine::Open(o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("queue_depth 0"), std::string::npos) << e.status();
  o.queue_depth = 32;
  e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->BeginCheckpoint({"v", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardSpec wraps = MakeShard("v", 1, 0, 1, 1).spec;
  wraps.tensors = {Tensor("w", DType::kF32, 16)};
  wraps.tensors[0].flat_name = "flat";
  wraps.tensors[0].flat_total = 64;
  wraps.tensors[0].flat_offset = UINT64_MAX - 4;
  auto w = (*e)->OpenShardWriter(wraps);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  ShardSpec huge = MakeShard("v", 1, 0, 1, 1).spec;
  huge.tensors.clear();
  for (int i = 0; i < 2048; ++i) {
    huge.tensors.push_back(Tensor(absl::StrCat("t", i), DType::kF64, int64_t{1} << 50));
  }
  w = (*e)->OpenShardWriter(huge);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  EXPECT_NE(w.status().message().find("shard payload over"), std::string::npos) << w.status();
}

// Resident memory of this process, bytes.
uint64_t ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// A reader's read-ahead holds 128 MiB of the shard's own chunks, whatever the reading engine's
// chunk_bytes: a shard of 64 MiB chunks read by an engine of 64 KiB ones keeps two of them
// ahead, not 32 (2 GiB; here the whole 512 MiB shard).
TEST(EngineReadAheadTest, WindowCountsTheShardsChunksNotTheEngines) {
  TempDir dir;
  EngineOptions big;
  big.data_dir = dir.path();
  big.chunk_bytes = 64 << 20;
  big.zstd_level = 0;
  constexpr size_t kBytes = 512 << 20;
  {
    auto e = Engine::Open(big);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->BeginCheckpoint({"ahead", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
    ShardSpec spec = MakeShard("ahead", 1, 0, 1, 1).spec;
    spec.tensors = {Tensor("w", DType::kU8, kBytes)};
    std::vector<uint8_t> bytes(kBytes, 7);
    ASSERT_TRUE((*e)->WriteShard(spec, {bytes.data()}).ok());
  }
  EngineOptions small = big;
  small.chunk_bytes = 64 << 10;
  auto e = Engine::Open(small);
  ASSERT_TRUE(e.ok()) << e.status();
  auto r = (*e)->OpenShardReader("ahead", 1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t before = ResidentBytes();
  std::vector<uint8_t> out(1 << 20);
  auto got = (*r)->Read(0, out.data(), out.size());
  ASSERT_TRUE(got.ok()) << got.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the read-ahead run
  const uint64_t grown = ResidentBytes() - before;
  EXPECT_LT(grown, 300u << 20) << "read ahead " << (grown >> 20) << " MiB";
  r->reset();
}

INSTANTIATE_TEST_SUITE_P(Paths, EngineTest,
                         ::testing::Values(Param{true, 1, 2}, Param{false, 1, 0},
                                           Param{true, 0, 2}, Param{false, 3, 1}),
                         [](const auto& info) {
                           return std::string(info.param.io_uring ? "uring" : "pwrite") +
                                  "_z" + std::to_string(info.param.zstd_level) + "_t" +
                                  std::to_string(info.param.encode_threads);
                         });

}  // namespace
}  // namespace storage
}  // namespace gradsnap
