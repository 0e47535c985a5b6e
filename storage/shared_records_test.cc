// Shared edge records (storage/shared_records.h): the table alone, then through shard readers
// of a real engine on real files: neighbouring ranges read their common chunk once, concurrent
// ranged reads stay exact, a damaged shared chunk is DATA_LOSS for every reader and is read
// from the disk again afterwards; compressed (zstd) records are shared and decoded exactly too.
#include "storage/shared_records.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/engine_impl.h"
#include "storage/fault_injection_fs.h"
#include "storage/test_util.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace storage {
namespace {

SharedRecords::Key KeyOf(uint64_t offset) { return {"seg", offset, 4096, 7}; }

TEST(SharedRecordsTest, FirstAskerReadsTheOthersWaitForIt) {
  auto pool = std::make_shared<BufferPool>(8192, 4);
  SharedRecords table(true);
  bool first = false;
  auto a = table.Acquire(KeyOf(0), 8192, pool, &first);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(first);
  auto b = table.Acquire(KeyOf(0), 8192, pool, &first);
  EXPECT_FALSE(first);
  EXPECT_EQ(a, b);
  EXPECT_EQ(table.hits(), 1u);
  auto other = table.Acquire(KeyOf(4096), 8192, pool, &first);  // another record
  EXPECT_TRUE(first);
  EXPECT_NE(other, a);
  // Waiters before the read completes run when it does, later ones at once; all see its status.
  std::vector<absl::Status> seen;
  b->OnReady([&](const absl::Status& s) { seen.push_back(s); });
  EXPECT_TRUE(seen.empty());
  std::memset(a->buffer()->data(), 0x5a, 4096);
  a->Complete(absl::OkStatus());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].ok());
  b->OnReady([&](const absl::Status& s) { seen.push_back(s); });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(b->buffer()->data()[4095], 0x5a);
  // A failed read reaches its waiters too.
  std::vector<absl::Status> failed;
  other->OnReady([&](const absl::Status& s) { failed.push_back(s); });
  other->Complete(absl::DataLossError("short read"));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].code(), absl::StatusCode::kDataLoss);
}

TEST(SharedRecordsTest, ReleasedOrForgottenRecordsAreReadAgain) {
  auto pool = std::make_shared<BufferPool>(8192, 4);
  SharedRecords table(true);
  bool first = false;
  auto a = table.Acquire(KeyOf(0), 8192, pool, &first);
  EXPECT_EQ(table.live(), 1u);
  a.reset();  // nobody holds it: not found any more, and its buffer is back in the pool
  EXPECT_EQ(table.live(), 0u);
  EXPECT_EQ(pool->cached(), 1u);
  a = table.Acquire(KeyOf(0), 8192, pool, &first);
  EXPECT_TRUE(first);
  EXPECT_EQ(pool->cached(), 0u);  // the pooled buffer was taken again
  // Forgotten while held (its bytes did not check): the next asker reads its own; the holder
  // keeps its record.
  table.Forget(a.get());
  auto b = table.Acquire(KeyOf(0), 8192, pool, &first);
  EXPECT_TRUE(first);
  EXPECT_NE(a, b);
  table.Forget(a.get());  // no longer the table's: b stays
  auto c = table.Acquire(KeyOf(0), 8192, pool, &first);
  EXPECT_FALSE(first);
  EXPECT_EQ(b, c);
  // Another length or CRC at the same offset (a checkpoint saved again) is another record.
  SharedRecords::Key k = KeyOf(0);
  k.crc = 8;
  EXPECT_NE(table.Acquire(k, 8192, pool, &first), b);
  EXPECT_TRUE(first);
  // A record of another size than the pool's gets a buffer of its own.
  auto big = table.Acquire(KeyOf(1 << 20), 20000, pool, &first);
  EXPECT_GE(big->capacity(), 20000u);
  SharedRecords off(false);
  EXPECT_EQ(off.Acquire(KeyOf(0), 8192, pool, &first), nullptr);
  EXPECT_TRUE(first);
}

// Reads [from, end) with r (ReadShared when `shared`, its pieces held to the end as gRPC may
// hold them, else Read), checking every byte against `stream`; OK or the error.
absl::Status ReadAndCheck(ShardReader* r, uint64_t from, uint64_t end, bool shared,
                          const std::vector<uint8_t>& stream) {
  std::vector<std::shared_ptr<const void>> holds;
  for (uint64_t pos = from; pos < end;) {
    const uint8_t* p = nullptr;
    std::vector<uint8_t> buf(end - pos);
    absl::StatusOr<size_t> got = 0;
    if (shared) {
      std::shared_ptr<const void> hold;
      got = r->ReadShared(pos, end - pos, &p, &hold);
      holds.push_back(std::move(hold));
    } else {
      got = r->Read(pos, buf.data(), end - pos);
      p = buf.data();
    }
    if (!got.ok()) return got.status();
    if (*got == 0) return absl::DataLossError("ended early");
    if (std::memcmp(p, stream.data() + pos, *got) != 0) {
      return absl::InternalError(absl::StrCat("wrong bytes at ", pos));
    }
    pos += *got;
  }
  return absl::OkStatus();
}

// Parameter: whether the readers read with io_uring (else pread on the decode pool).
class SharedEdgesTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    fs_.set_real_descriptors(true);  // io_uring reads go through the injected faults
    EngineOptions o;
    o.data_dir = dir_.path();
    o.chunk_bytes = 32 << 10;  // several chunks per tensor
    o.zstd_level = 0;          // raw records: their CRC is checked by the reader's caller
    o.use_io_uring = GetParam();
    o.fs = &fs_;
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    ASSERT_TRUE(engine_->BeginCheckpoint({"sj", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
    data_ = MakeShard("sj", 1, 0, 1, 60000);  // w: 240,000 bytes, about 8 chunks
    ASSERT_TRUE(engine_->WriteShard(data_.spec, data_.ptrs()).ok());
    stream_ = data_.stream();
  }
  SharedRecords* table() { return static_cast<EngineImpl*>(engine_.get())->shared_records(); }
  std::unique_ptr<ShardReader> Reader(uint64_t end) {
    auto r = engine_->OpenShardReader("sj", 1, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    (*r)->SetReadEnd(end);
    return std::move(*r);
  }
  // Reads [from, end) with r (ReadShared when `shared`), checking every byte; OK or the error.
  absl::Status ReadRange(ShardReader* r, uint64_t from, uint64_t end, bool shared) {
    return ReadAndCheck(r, from, end, shared, stream_);
  }

  gradsnap::testing::TempDir dir_{"shared_edges"};
  FaultInjectionFileSystem fs_;
  std::unique_ptr<Engine> engine_;
  ShardData data_;
  std::vector<uint8_t> stream_;
};

TEST_P(SharedEdgesTest, NeighbouringRangesReadTheirCommonChunkOnce) {
  const uint64_t cut = 100000;  // inside the 4th chunk of w
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared);
    const uint64_t hits = table()->hits();
    auto a = Reader(cut);
    ASSERT_TRUE(ReadRange(a.get(), 0, cut, shared).ok());
    auto b = Reader(stream_.size());  // while a still holds the chunk holding the cut
    ASSERT_TRUE(ReadRange(b.get(), cut, stream_.size(), shared).ok());
    EXPECT_EQ(table()->hits(), hits + 1);
    a.reset();
    b.reset();
    EXPECT_EQ(table()->live(), 0u);  // nobody holds it: a later read goes to the disk
    auto c = Reader(stream_.size());
    ASSERT_TRUE(ReadRange(c.get(), cut, stream_.size(), shared).ok());
    EXPECT_EQ(table()->hits(), hits + 1);
  }
  // Whole-shard and whole-tensor reads share nothing.
  const uint64_t hits = table()->hits();
  auto w = Reader(UINT64_MAX);
  ExpectRestores(engine_.get(), data_);
  ASSERT_TRUE(ReadRange(w.get(), 0, stream_.size(), true).ok());
  EXPECT_EQ(table()->hits(), hits);
}

TEST_P(SharedEdgesTest, ConcurrentSlicesAtRandomCutsStayExact) {
  std::mt19937_64 rng(3);
  for (int round = 0; round < 30; ++round) {
    // 4 readers, each a slice between random cuts, read at once.
    std::vector<uint64_t> cuts = {0, stream_.size()};
    for (int i = 0; i < 3; ++i) cuts.push_back(rng() % stream_.size());
    std::sort(cuts.begin(), cuts.end());
    std::vector<absl::Status> status(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        auto r = Reader(cuts[i + 1]);
        status[i] = ReadRange(r.get(), cuts[i], cuts[i + 1], (round + i) % 2 == 0);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(status[i].ok()) << round << " " << i << status[i];
  }
  EXPECT_EQ(table()->live(), 0u);
}

TEST_P(SharedEdgesTest, DamagedSharedChunkIsDataLossForEachReaderAndReadAgain) {
  // Flip a byte of the record holding stream byte 100000 (records follow stream order).
  EngineImpl* impl = static_cast<EngineImpl*>(engine_.get());
  absl::StatusOr<std::vector<ChunkRecord>> where = absl::NotFoundError("no chunks");
  for (uint32_t n = 64; n > 0 && !where.ok(); --n) where = impl->LoadChunks("sj", 1, 0, n);
  ASSERT_TRUE(where.ok()) << where.status();
  const ChunkRecord* edge = nullptr;
  for (const ChunkRecord& c : *where) {
    if (c.header.stream_offset <= 100000 && 100000 < c.header.stream_offset + c.header.raw_len) {
      edge = &c;
    }
  }
  ASSERT_NE(edge, nullptr);
  const std::string seg = impl->SegmentPath("sj", 1, 0, edge->segment);
  ASSERT_TRUE(testing::FlipByte(seg, edge->offset + edge->header.record_len() - 10, 0x04).ok());
  const uint64_t cut = 100000, hits = table()->hits();
  // a takes the first bytes only: its read-ahead has the damaged chunk read (its CRC is checked
  // when a reaches it); b, starting inside that chunk, shares it and finds the damage itself.
  auto a = Reader(cut);
  const uint8_t* p = nullptr;
  std::shared_ptr<const void> hold;
  ASSERT_TRUE(a->ReadShared(0, 1000, &p, &hold).ok());
  auto b = Reader(stream_.size());
  absl::Status sb = ReadRange(b.get(), cut, stream_.size(), true);
  EXPECT_EQ(table()->hits(), hits + 1);
  EXPECT_EQ(sb.code(), absl::StatusCode::kDataLoss) << sb;
  EXPECT_NE(sb.message().find("CRC mismatch"), std::string::npos) << sb;
  absl::Status sa = ReadRange(a.get(), 0, cut, true);
  EXPECT_EQ(sa.code(), absl::StatusCode::kDataLoss) << sa;
  // Forgotten: a new reader reads the disk again (no hit) and finds the damage too, while a
  // and b still hold the record.
  auto c = Reader(stream_.size());
  absl::Status sc = ReadRange(c.get(), cut, stream_.size(), false);
  EXPECT_EQ(sc.code(), absl::StatusCode::kDataLoss) << sc;
  EXPECT_EQ(table()->hits(), hits + 1);
}

// A read error under a shared edge chunk fails every reader that needs it, cleanly; once the
// disk reads again, nothing of the failed read is served: the ranges read back exact.
TEST_P(SharedEdgesTest, ReadErrorsFailEveryReaderThenTheDiskIsReadAgain) {
  const uint64_t cut = 100000;
  FaultInjectionFileSystem::Faults f;
  f.fail_read_at = -1;  // every read fails with EIO
  f.crash_on_fault = false;
  fs_.SetFaults(f);
  {
    auto a = Reader(cut);
    const uint8_t* p = nullptr;
    std::shared_ptr<const void> hold;
    absl::StatusOr<size_t> first = a->ReadShared(0, 1000, &p, &hold);
    EXPECT_FALSE(first.ok());
    auto b = Reader(stream_.size());
    absl::Status sb = ReadRange(b.get(), cut, stream_.size(), true);
    EXPECT_FALSE(sb.ok());
    EXPECT_EQ(sb.code(), absl::StatusCode::kDataLoss) << sb;
  }
  fs_.SetFaults(FaultInjectionFileSystem::Faults());
  auto a = Reader(cut);
  auto b = Reader(stream_.size());
  EXPECT_TRUE(ReadRange(a.get(), 0, cut, true).ok());
  EXPECT_TRUE(ReadRange(b.get(), cut, stream_.size(), true).ok());
}

// Compressed records are shared the same way: each reader decompresses the shared record into
// its own buffer and checks both CRCs itself.
TEST(SharedEdgesZstdTest, CompressedEdgeRecordsAreSharedAndExact) {
  gradsnap::testing::TempDir dir("shared_edges_zstd");
  EngineOptions o;
  o.data_dir = dir.path();
  o.chunk_bytes = 32 << 10;
  o.zstd_level = 1;
  o.adapt_compression = false;  // every chunk that shrinks is stored compressed
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->BeginCheckpoint({"zj", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d = MakeShard("zj", 1, 0, 1, 60000);
  for (size_t i = 0; i < 60000; ++i) {  // compressible weights
    const float f = static_cast<float>(i % 97) * 0.25f;
    std::memcpy(d.bytes[0].data() + 4 * i, &f, 4);
  }
  ASSERT_TRUE((*e)->WriteShard(d.spec, d.ptrs()).ok());
  EngineImpl* impl = static_cast<EngineImpl*>(e->get());
  absl::StatusOr<std::vector<ChunkRecord>> chunks = absl::NotFoundError("no chunks");
  for (uint32_t n = 64; n > 0 && !chunks.ok(); --n) chunks = impl->LoadChunks("zj", 1, 0, n);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  size_t zstd = 0;
  for (const ChunkRecord& c : *chunks) zstd += c.header.codec == ChunkCodec::kZstd ? 1 : 0;
  ASSERT_GT(zstd, 3u) << "the weights' chunks should be stored compressed";
  const std::vector<uint8_t> stream = d.stream();
  auto read = [&](uint64_t from, uint64_t end, bool shared) -> absl::Status {
    auto r = (*e)->OpenShardReader("zj", 1, 0);
    if (!r.ok()) return r.status();
    (*r)->SetReadEnd(end);
    return ReadAndCheck(r->get(), from, end, shared, stream);
  };
  SharedRecords* table = impl->shared_records();
  {  // Neighbours, the first still open while the second reads: their common chunk is shared.
    const uint64_t cut = 100000;
    auto a = (*e)->OpenShardReader("zj", 1, 0);
    ASSERT_TRUE(a.ok());
    (*a)->SetReadEnd(cut);
    absl::Status head = ReadAndCheck(a->get(), 0, cut, /*shared=*/false, stream);
    ASSERT_TRUE(head.ok()) << head;
    ASSERT_TRUE(read(cut, stream.size(), true).ok());
    EXPECT_EQ(table->hits(), 1u);
  }
  std::mt19937_64 rng(5);
  for (int round = 0; round < 20; ++round) {
    std::vector<uint64_t> cuts = {0, stream.size()};
    for (int i = 0; i < 3; ++i) cuts.push_back(1 + rng() % (stream.size() - 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<absl::Status> status(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        status[i] = read(cuts[i], cuts[i + 1], (round + i) % 2 == 0);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(status[i].ok()) << round << " " << i << status[i];
  }
  EXPECT_EQ(table->live(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Uring, SharedEdgesTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "IoUring" : "Pread";
                         });

}  // namespace
}  // namespace storage
}  // namespace gradsnap
