// Engine basics: write, list, manifest, read back, verify, resume, bad input, delete, GC.
#include "storage/engine.h"

#include <thread>

#include "common/sha256.h"
#include "gtest/gtest.h"
#include "storage/test_util.h"

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
    return o;
  }
  std::unique_ptr<Engine> OpenEngine() {
    auto e = Engine::Open(Options());
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  TempDir dir_;
};

struct ShardData {
  ShardSpec spec;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<const void*> ptrs() const {
    std::vector<const void*> p;
    for (const auto& b : bytes) p.push_back(b.data());
    return p;
  }
};

ShardData MakeShard(const std::string& job, int64_t step, int32_t rank, uint64_t seed) {
  ShardData d;
  d.spec.job = job;
  d.spec.step = step;
  d.spec.rank = rank;
  d.spec.metadata = "rank-meta";
  d.spec.tensors = {Tensor("w", DType::kF32, 100000), Tensor("empty", DType::kF32, 0),
                    Tensor("g", DType::kBF16, 33333), Tensor("step", DType::kI64, 1)};
  d.bytes.push_back(WeightBytes(100000, seed));
  d.bytes.emplace_back();
  d.bytes.push_back(RandomBytes(33333 * 2, seed + 1));
  d.bytes.push_back(RandomBytes(8, seed + 2));
  return d;
}

void ExpectRestores(Engine* e, const ShardData& d) {
  auto r = e->OpenShardReader(d.spec.job, d.spec.step, d.spec.rank);
  ASSERT_TRUE(r.ok()) << r.status();
  const ShardInfo& info = (*r)->info();
  ASSERT_EQ(info.tensors.size(), d.bytes.size());
  EXPECT_EQ(info.metadata, d.spec.metadata);
  std::vector<uint8_t> stream;
  for (size_t i = 0; i < d.bytes.size(); ++i) {
    EXPECT_EQ(info.tensors[i].spec.sha256, Sha256Hex(d.bytes[i].data(), d.bytes[i].size()));
    std::vector<uint8_t> out(d.bytes[i].size());
    ASSERT_TRUE((*r)->ReadTensor(i, out.data(), out.size()).ok());
    EXPECT_EQ(out, d.bytes[i]) << "tensor " << i;
    stream.insert(stream.end(), d.bytes[i].begin(), d.bytes[i].end());
  }
  std::vector<uint8_t> got(stream.size());
  uint64_t pos = 0;
  for (;;) {
    auto n = (*r)->Read(pos, got.data() + pos, std::min<size_t>(7777, got.size() - pos + 1));
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n == 0) break;
    pos += *n;
  }
  EXPECT_EQ(pos, stream.size());
  EXPECT_EQ(got, stream);
}

TEST_P(EngineTest, WriteListReadVerify) {
  auto e = OpenEngine();
  ASSERT_NE(e, nullptr);
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
  EXPECT_EQ(m->shards[1].tensors[2].spec.sha256,
            Sha256Hex(s1.bytes[2].data(), s1.bytes[2].size()));
  EXPECT_GT(m->shards[0].tensors[0].chunks, 1u);
  EXPECT_TRUE(e->Verify("job1", 10).ok());
  ExpectRestores(e.get(), s0);
  ExpectRestores(e.get(), s1);
  EXPECT_EQ(e->BeginCheckpoint(c).code(), absl::StatusCode::kAlreadyExists);

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
