// ShardWriter's record buffers: a writer takes, when it opens and before any byte arrives, the
// full-size buffers it can hold at once (its chunks in flight and the one being filled, no more
// than its shard has chunks), so the engine's pool reaches its steady size in the first write
// and a later write of the same shape allocates none; they return to the pool when it closes.
// EngineOptions::prefault_writers fills the pool at Open.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/engine_impl.h"
#include "storage/storage_stats.h"
#include "storage/test_util.h"
#include "tests/testing/gtest_util.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr size_t kChunk = 64 << 10;

class ShardWriterBuffersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.data_dir = dir_.path();
    o.chunk_bytes = kChunk;
    o.zstd_level = 0;  // no compressed copies: raw record buffers only
    options_ = o;
    engine_ = gradsnap::testing::ValueOrNull(Engine::Open(o));
    ASSERT_NE(engine_, nullptr);
    ASSERT_TRUE(engine_->BeginCheckpoint({"j", 1, CheckpointKind::kFull, -1, 4, ""}).ok());
  }
  BufferPool* pool() { return static_cast<EngineImpl*>(engine_.get())->record_pool(); }
  // Full chunks one writer keeps in flight, from the memory bound the engine publishes.
  size_t MaxJobs() const {
    const size_t full = AlignUp(MaxRecordSize(kChunk));
    const size_t jobs = (MaxShardWriterBufferBytes(options_) / full - 1) / 2;
    EXPECT_EQ(jobs + 1, ShardWriterReservedBuffers(options_));
    return jobs;
  }
  static ShardSpec Spec(int32_t rank, int64_t bytes) {
    ShardSpec s = MakeShard("j", 1, rank, /*seed=*/1, /*w_numel=*/1).spec;
    s.tensors = {Tensor("w", DType::kU8, bytes)};
    return s;
  }

  TempDir dir_;
  EngineOptions options_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(ShardWriterBuffersTest, OpenTakesTheBuffersOfItsChunksInFlight) {
  EXPECT_EQ(pool()->cached(), 0u);
  {
    auto w = engine_->OpenShardWriter(Spec(0, 10 * kChunk - 5));  // 10 chunks
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(pool()->cached(), 0u);  // the writer holds them
  }
  EXPECT_EQ(pool()->cached(), 10u);  // returned unused, ready for the next writer
  {
    auto w = engine_->OpenShardWriter(Spec(1, 1000 * kChunk));  // more than it keeps in flight
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(pool()->cached(), 0u);  // took the 10 and allocated the rest
  }
  EXPECT_EQ(pool()->cached(), MaxJobs() + 1);
}

// Two writers at once, the second opening while the first's chunks complete: each keeps its own
// buffers (the first's completed ones are not the second's to take), so the pool ends with
// exactly their two reservations, and a second round of the same shape allocates nothing.
TEST_F(ShardWriterBuffersTest, ConcurrentWritersKeepTheirOwnBuffers) {
  const std::vector<uint8_t> bytes = RandomBytes(40 * kChunk, 1);
  for (int32_t round = 0; round < 2; ++round) {
    auto a = engine_->OpenShardWriter(Spec(2 * round, 40 * kChunk));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE((*a)->Append(bytes.data(), 20 * kChunk).ok());
    auto b = engine_->OpenShardWriter(Spec(2 * round + 1, 40 * kChunk));
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE((*b)->Append(bytes.data(), bytes.size()).ok());
    ASSERT_TRUE((*a)->Append(bytes.data() + 20 * kChunk, 20 * kChunk).ok());
    ASSERT_TRUE((*a)->Finish().ok());
    ASSERT_TRUE((*b)->Finish().ok());
    a->reset();
    b->reset();
    EXPECT_EQ(pool()->cached(), 2 * (MaxJobs() + 1)) << "round " << round;
  }
}

// EngineOptions::prefault_writers: Open fills the pool with the buffers of that many writers,
// at most the 64 it caches; read-only engines write nothing and take none.
TEST_F(ShardWriterBuffersTest, PrefaultWritersFillsThePoolAtOpen) {
  engine_.reset();
  for (int writers : {0, 2, 100}) {
    EngineOptions o = options_;
    o.prefault_writers = writers;
    auto e = gradsnap::testing::ValueOrNull(Engine::Open(o));
    ASSERT_NE(e, nullptr);
    const size_t want = std::min<size_t>(writers * ShardWriterReservedBuffers(o), 64);
    EXPECT_EQ(static_cast<EngineImpl*>(e.get())->record_pool()->cached(), want) << writers;
  }
  EngineOptions ro = options_;
  ro.prefault_writers = 2;
  ro.read_only = true;
  auto e = gradsnap::testing::ValueOrNull(Engine::Open(ro));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(static_cast<EngineImpl*>(e.get())->record_pool()->cached(), 0u);
}

// EngineOptions::prefault_read_ahead adds the readers' shared read-ahead buffers (read-only
// engines too: they read), within the pool's 64.
TEST_F(ShardWriterBuffersTest, PrefaultReadAheadFillsThePoolForReaders) {
  engine_.reset();
  for (int writers : {0, 2, 100}) {
    for (bool read_only : {false, true}) {
      EngineOptions o = options_;
      o.prefault_writers = writers;
      o.prefault_read_ahead = true;
      o.read_only = read_only;
      auto e = gradsnap::testing::ValueOrNull(Engine::Open(o));
      ASSERT_NE(e, nullptr);
      const size_t w = read_only ? 0 : writers * ShardWriterReservedBuffers(o);
      EXPECT_EQ(static_cast<EngineImpl*>(e.get())->record_pool()->cached(),
                std::min<size_t>(w + EngineImpl::kReaderFreshBuffers, 64))
          << writers << " " << read_only;
    }
  }
}

// Entries of /proc/self/<what> (fd: open files, task: threads).
int CountProcEntries(const char* what) {
  DIR* d = ::opendir((std::string("/proc/self/") + what).c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// A shard spread over many segments without a Flush (the embedded client never flushes) keeps
// one segment open, not one file, io_uring ring and ring thread per segment until the commit;
// and no segment grows past segment_bytes, whatever the encoders do at once.
TEST(ShardWriterSegmentsTest, RolledSegmentsAreClosedAndStayWithinTheirSize) {
  TempDir dir;
  EngineOptions o;
  o.data_dir = dir.path();
  o.chunk_bytes = 256 << 10;
  o.segment_bytes = 1 << 20;
  o.zstd_level = 0;
  o.encode_threads = 4;
  auto engine = gradsnap::testing::ValueOrNull(Engine::Open(o));
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->BeginCheckpoint({"segs", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  constexpr size_t kBytes = 48 << 20;  // 48 segments of 1 MiB
  ShardSpec spec = MakeShard("segs", 1, 0, 1, 1).spec;
  spec.tensors = {Tensor("w", DType::kU8, kBytes)};
  const std::vector<uint8_t> bytes = RandomBytes(kBytes, 5);
  const int fds = CountProcEntries("fd"), threads = CountProcEntries("task");
  const int64_t fixed_before = StorageStats::Get().fixed_buffer_writes->Value();
  auto w = engine->OpenShardWriter(spec);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(bytes.data(), kBytes - (1 << 20)).ok());
  // Open while most of the shard went out: the writer's own few, not one per segment.
  EXPECT_LT(CountProcEntries("fd") - fds, 12);
  EXPECT_LT(CountProcEntries("task") - threads, 16);
  ASSERT_TRUE((*w)->Append(bytes.data() + kBytes - (1 << 20), 1 << 20).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  w->reset();
  // The 192 chunk records went out from registered (fixed) buffers.
  EXPECT_GE(StorageStats::Get().fixed_buffer_writes->Value() - fixed_before, 192);
  ASSERT_TRUE(engine->Verify("segs", 1).ok());
  auto r = engine->OpenShardReader("segs", 1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE((*r)->ReadTensor(0, back.data(), back.size()).ok());
  EXPECT_TRUE(back == bytes);
  // Every segment but the last (which ends with the shard footer) is at most segment_bytes.
  std::vector<uint64_t> sizes;
  const std::string segs = static_cast<EngineImpl*>(engine.get())->CheckpointDir("segs", 1);
  DIR* d = ::opendir(segs.c_str());
  ASSERT_NE(d, nullptr) << segs;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (std::string(e->d_name).find(".seg") != std::string::npos) names.push_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 40u);
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    struct stat st;
    ASSERT_EQ(::stat((segs + "/" + names[i]).c_str(), &st), 0);
    EXPECT_LE(static_cast<uint64_t>(st.st_size), o.segment_bytes) << names[i];
  }
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
