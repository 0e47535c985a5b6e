// Client over the embedded engine: save/list/show/restore/verify/delete/gc round trips with
// random tensors of several dtypes and ranks, concurrency with bounded memory, error codes,
// and the safetensors header.
#include <future>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/backends.h"
#include "client/client.h"
#include "client/safetensors.h"
#include "client/save_util.h"
#include "client/test_util.h"
#include "common/digest.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/temp_dir.h"

namespace gradsnap {
namespace client {
namespace {

using testing::MakeShard;
using testing::SaveTestCheckpoint;
using testing::TestCheckpoint;
using testing::TestShard;

class EmbeddedClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    client_ = Open();
  }
  void TearDown() override {
    client_.reset();
  }
  // A client of dir_, or of `dir` when given.
  std::unique_ptr<Client> Open(size_t max_inflight = 256u << 20, const std::string& dir = "") {
    ClientOptions o;
    o.local_dir = dir.empty() ? dir_ : dir;
    o.max_inflight_bytes = max_inflight;
    return gradsnap::testing::ValueOrNull(Client::Connect(o));
  }
  ShardSpec Spec(const std::string& job, int64_t step, int32_t rank) {
    ShardSpec s;
    s.job = job;
    s.step = step;
    s.rank = rank;
    return s;
  }

  gradsnap::testing::TempDir tmp_{"client"};
  std::string dir_;
  std::unique_ptr<Client> client_;
};

void ExpectRestores(Client& c, const TestCheckpoint& ckpt) {
  for (const TestShard& s : ckpt.shards) {
    std::string got;
    uint64_t last_done = 0, last_total = 0;
    auto sink = [&](const void* p, size_t n) {
      got.append(static_cast<const char*>(p), n);
      return absl::OkStatus();
    };
    auto progress = [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; };
    ASSERT_TRUE(c.RestoreShard(ckpt.spec.job, ckpt.spec.step, s.rank, sink, progress).ok());
    EXPECT_TRUE(got == s.Payload()) << "rank " << s.rank << " payload differs";
    EXPECT_EQ(last_done, got.size());
    EXPECT_EQ(last_total, got.size());
    for (const auto& t : s.tensors) {
      std::string buf(t.data.size(), '\xee');
      ASSERT_TRUE(c.RestoreTensor(ckpt.spec.job, ckpt.spec.step, s.rank, t.spec.name, buf.data(),
                                  buf.size()).ok()) << t.spec.name;
      EXPECT_TRUE(buf == t.data) << t.spec.name;
    }
  }
}

TEST_F(EmbeddedClientTest, SaveListShowRestoreVerifySeveralRanks) {
  TestCheckpoint ckpt;
  ckpt.spec.job = "job-a";
  ckpt.spec.step = 100;
  ckpt.spec.world_size = 3;
  ckpt.spec.metadata = "opaque";
  ASSERT_TRUE(client_->BeginCheckpoint(ckpt.spec).ok());
  for (int32_t r = 0; r < 3; ++r) ckpt.shards.push_back(MakeShard(7, r, 1u << 20));
  // Not listed until every rank is saved.
  auto shard_spec = [&](int32_t r) {
    ShardSpec s = Spec("job-a", 100, r);
    s.metadata = ckpt.shards[r].metadata;
    return s;
  };
  for (int32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(client_->SaveShard(shard_spec(r), ckpt.shards[r].Refs()).ok());
    auto listed = client_->List("job-a");
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_TRUE(listed->empty()) << "listed after rank " << r;
  }
  auto pending = client_->List("job-a", /*include_pending=*/true);
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->size(), 1u);
  EXPECT_EQ((*pending)[0].state, CheckpointState::kPending);
  ASSERT_TRUE(client_->SaveShard(shard_spec(2), ckpt.shards[2].Refs()).ok());

  auto listed = client_->List("job-a");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  const CheckpointInfo& info = (*listed)[0];
  EXPECT_EQ(info.state, CheckpointState::kCommitted);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.metadata, "opaque");
  uint64_t raw = 0;
  for (const auto& s : ckpt.shards) raw += s.Payload().size();
  EXPECT_EQ(info.raw_bytes, raw);

  auto m = client_->Show("job-a", 100);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->shards.size(), 3u);
  for (const ShardInfo& s : m->shards) {
    const TestShard& want = ckpt.shards[s.rank];
    EXPECT_TRUE(s.committed);
    EXPECT_EQ(s.metadata, want.metadata);
    ASSERT_EQ(s.tensors.size(), want.tensors.size());
    for (size_t i = 0; i < s.tensors.size(); ++i) {
      const TensorSpec& got = s.tensors[i].spec;
      const TensorSpec& exp = want.tensors[i].spec;
      EXPECT_EQ(got.name, exp.name);
      EXPECT_EQ(got.dtype, exp.dtype);
      EXPECT_EQ(got.shape, exp.shape);
      EXPECT_EQ(got.byte_length, exp.byte_length);
      EXPECT_EQ(got.flat_name, exp.flat_name);
      EXPECT_EQ(got.flat_offset, exp.flat_offset);
      EXPECT_EQ(s.tensors[i].digest,
                DigestHex(s.digest_algo, want.tensors[i].data.data(), want.tensors[i].data.size()));
    }
  }
  ExpectRestores(*client_, ckpt);
  EXPECT_TRUE(client_->Verify("job-a", 100).ok());
  uint64_t done = 0, total = 0;
  EXPECT_TRUE(client_->Verify("job-a", 100, [&](uint64_t d, uint64_t t) { done = d, total = t; }).ok());
  EXPECT_EQ(done, raw);
  EXPECT_EQ(total, raw);

  // Still there after reopening the directory.
  client_.reset();
  client_ = Open();
  ExpectRestores(*client_, ckpt);
  auto jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(*jobs, std::vector<std::string>{"job-a"});
  EXPECT_TRUE(client_->Health().ok());
}

TEST_F(EmbeddedClientTest, DeleteAndGc) {
  for (int64_t step : {0, 10, 20, 30, 40}) {
    ASSERT_TRUE(SaveTestCheckpoint(*client_, "gcjob", step, 2, 1, 64 << 10).ok()) << step;
  }
  auto r = client_->Gc("gcjob", GcPolicy{2, 20});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, std::vector<int64_t>{10});
  ASSERT_TRUE(client_->Delete("gcjob", 30).ok());
  auto listed = client_->List("gcjob");
  ASSERT_TRUE(listed.ok());
  std::vector<int64_t> steps;
  for (const auto& i : *listed) steps.push_back(i.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 20, 40}));
  EXPECT_EQ(client_->Show("gcjob", 30).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Show("gcjob", 10).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client_->Verify("gcjob", 40).ok());
}

// RestoreTensor keeps readers of recent shards; a deleted and re-written step must not be
// served from a stale one.
TEST_F(EmbeddedClientTest, RestoreAfterDeleteAndRewriteSeesNewData) {
  auto first = SaveTestCheckpoint(*client_, "re", 50, 1, 100, 64 << 10);
  ASSERT_TRUE(first.ok());
  const testing::TestTensor& t0 = first->shards[0].tensors[0];
  std::string buf(t0.data.size(), 0);
  ASSERT_TRUE(client_->RestoreTensor("re", 50, 0, t0.spec.name, buf.data(), buf.size()).ok());
  EXPECT_TRUE(buf == t0.data);
  ASSERT_TRUE(client_->Delete("re", 50).ok());
  auto second = SaveTestCheckpoint(*client_, "re", 50, 1, 200, 64 << 10);
  ASSERT_TRUE(second.ok()) << second.status();
  const testing::TestTensor& t1 = second->shards[0].tensors[0];
  ASSERT_FALSE(t1.data == t0.data);
  ASSERT_TRUE(client_->RestoreTensor("re", 50, 0, t1.spec.name, buf.data(), buf.size()).ok());
  EXPECT_TRUE(buf == t1.data);
  ExpectRestores(*client_, *second);
}

// RestoreShardLent: the lent pieces are the verified chunks themselves and stay valid and
// unchanged while held, however far the restore has gone on; all of them held to the end
// still make up the payload, and progress reaches the total.
TEST_F(EmbeddedClientTest, RestoreShardLentPiecesStayValidWhileHeld) {
  // A 72 MiB tensor (18 chunks of 4 MiB) and small ones: every chunk stays held to the end.
  auto ckpt = SaveTestCheckpoint(*client_, "lent", 1, 1, 7, 72u << 20);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string want = ckpt->shards[0].Payload();
  ASSERT_GT(want.size(), 72u << 20);
  std::vector<std::pair<std::string_view, std::shared_ptr<const void>>> held;
  uint64_t last_done = 0;
  absl::Status s = client_->RestoreShardLent(
      "lent", 1, 0,
      [&](const void* p, size_t n, std::shared_ptr<const void> hold) {
        EXPECT_NE(hold, nullptr);
        held.emplace_back(std::string_view(static_cast<const char*>(p), n), std::move(hold));
        return absl::OkStatus();
      },
      [&](uint64_t done, uint64_t) { last_done = done; });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(last_done, want.size());
  std::string got;
  for (const auto& [bytes, hold] : held) got.append(bytes);
  EXPECT_TRUE(got == want);
  // A sink's error stops the restore and is returned.
  s = client_->RestoreShardLent("lent", 1, 0, [](const void*, size_t, std::shared_ptr<const void>) {
    return absl::CancelledError("enough");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
}

TEST_F(EmbeddedClientTest, ErrorCodes) {
  EXPECT_EQ(client_->List("bad/name").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Show("nojob", 1).status().code(), absl::StatusCode::kNotFound);
  auto ckpt = SaveTestCheckpoint(*client_, "j", 5, 1, 3, 0);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::string buf(64, 0);
  EXPECT_EQ(client_->RestoreTensor("j", 5, 0, "no-such-tensor", buf.data(), buf.size()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Verify("j", 6).code(), absl::StatusCode::kNotFound);

  CheckpointSpec cs{"j", 6, CheckpointKind::kFull, -1, 2, ""};
  ASSERT_TRUE(client_->BeginCheckpoint(cs).ok());
  TestShard s = MakeShard(1, 0, 0);
  // A spec whose tensor list disagrees with the refs.
  ShardSpec bad = Spec("j", 6, 0);
  bad.tensors.push_back(s.tensors[0].spec);
  EXPECT_EQ(client_->SaveShard(bad, s.Refs()).code(), absl::StatusCode::kInvalidArgument);
  // byte_length that does not match shape x dtype.
  std::vector<TensorRef> refs = s.Refs();
  refs[0].spec.byte_length += 4;
  EXPECT_EQ(client_->SaveShard(Spec("j", 6, 0), refs).code(), absl::StatusCode::kInvalidArgument);
  // A pending checkpoint cannot be restored.
  ASSERT_TRUE(client_->SaveShard(Spec("j", 6, 0), s.Refs()).ok());
  auto discard = [](const void*, size_t) { return absl::OkStatus(); };
  absl::Status st = client_->RestoreShard("j", 6, 0, discard);
  EXPECT_FALSE(st.ok());
  ASSERT_TRUE(client_->AbortCheckpoint("j", 6).ok());
  auto all = client_->List("j", true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 1u);

  ClientOptions none;
  EXPECT_EQ(Client::Connect(none).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EmbeddedClientTest, ConcurrentAsyncSavesStayWithinBudget) {
  constexpr size_t kBudget = 3u << 20;
  client_.reset();
  client_ = Open(kBudget);
  ASSERT_NE(client_, nullptr);
  constexpr int kRanks = 12;
  CheckpointSpec cs{"conc", 1, CheckpointKind::kFull, -1, kRanks, ""};
  ASSERT_TRUE(client_->BeginCheckpoint(cs).ok());
  std::vector<TestShard> shards;
  for (int r = 0; r < kRanks; ++r) shards.push_back(MakeShard(11, r, 1u << 20));
  // One extra shard larger than the whole budget, in another checkpoint: it must run alone.
  CheckpointSpec big{"conc", 2, CheckpointKind::kFull, -1, 1, ""};
  ASSERT_TRUE(client_->BeginCheckpoint(big).ok());
  TestShard huge = MakeShard(12, 0, 5u << 20);

  std::vector<std::future<absl::Status>> futures;
  for (const TestShard& s : shards) futures.push_back(client_->SaveShardAsync(Spec("conc", 1, s.rank), s.Refs()));
  futures.push_back(client_->SaveShardAsync(Spec("conc", 2, 0), huge.Refs()));
  for (auto& f : futures) EXPECT_TRUE(f.get().ok());

  uint64_t shard_bytes = shards[0].Payload().size();
  const ByteBudget* budget = EmbeddedSaveBudget(*client_);
  ASSERT_NE(budget, nullptr);
  const ByteBudget::Usage usage = budget->usage();  // this client's saves only
  EXPECT_LE(usage.peak, std::max<uint64_t>(kBudget, huge.Payload().size()));
  EXPECT_GE(usage.peak, shard_bytes);
  EXPECT_EQ(usage.in_flight, 0u);
  auto listed = client_->List("conc");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u);
  TestCheckpoint ckpt{cs, shards};
  ExpectRestores(*client_, ckpt);
}

// Two clients in one process keep their own in-flight gauges (labelled per client) instead of
// overwriting one process-wide value.
TEST_F(EmbeddedClientTest, TwoClientsInOneProcessKeepTheirOwnMetrics) {
  gradsnap::testing::TempDir other_tmp("client2");
  const std::string other_dir = other_tmp.path();
  std::unique_ptr<Client> other = Open(256u << 20, other_dir);
  ASSERT_NE(other, nullptr);
  const ByteBudget* mine = EmbeddedSaveBudget(*client_);
  const ByteBudget* theirs = EmbeddedSaveBudget(*other);
  ASSERT_TRUE(mine != nullptr && theirs != nullptr);
  ASSERT_NE(mine->metrics_id(), theirs->metrics_id());

  TestShard small = MakeShard(21, 0, 64u << 10);
  TestShard large = MakeShard(22, 0, 2u << 20);
  ASSERT_TRUE(client_->BeginCheckpoint({"m", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ASSERT_TRUE(other->BeginCheckpoint({"m", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ASSERT_TRUE(client_->SaveShard(Spec("m", 1, 0), small.Refs()).ok());
  ASSERT_TRUE(other->SaveShard(Spec("m", 1, 0), large.Refs()).ok());

  auto gauge = [](const char* base, const ByteBudget* b) {
    return Registry::Global()
        ->GetCounter(absl::StrCat(base, "{client=\"", b->metrics_id(), "\"}"), "", true)
        ->Value();
  };
  EXPECT_EQ(gauge("gradsnap_client_inflight_peak_bytes", mine),
            static_cast<int64_t>(small.Payload().size()));
  EXPECT_EQ(gauge("gradsnap_client_inflight_peak_bytes", theirs),
            static_cast<int64_t>(large.Payload().size()));
  EXPECT_EQ(gauge("gradsnap_client_inflight_bytes", mine), 0);
  EXPECT_EQ(gauge("gradsnap_client_inflight_bytes", theirs), 0);
  const std::string text = Registry::Global()->RenderPrometheus();
  EXPECT_NE(text.find(absl::StrCat("gradsnap_client_inflight_peak_bytes{client=\"",
                                   theirs->metrics_id(), "\"} ", large.Payload().size())),
            std::string::npos)
      << text;
  other.reset();
}

TEST_F(EmbeddedClientTest, DestructorDrainsQueuedSaves) {
  CheckpointSpec cs{"drain", 3, CheckpointKind::kFull, -1, 4, ""};
  ASSERT_TRUE(client_->BeginCheckpoint(cs).ok());
  std::vector<TestShard> shards;
  for (int r = 0; r < 4; ++r) shards.push_back(MakeShard(5, r, 256 << 10));
  std::vector<std::future<absl::Status>> futures;
  for (const TestShard& s : shards) futures.push_back(client_->SaveShardAsync(Spec("drain", 3, s.rank), s.Refs()));
  client_.reset();
  for (auto& f : futures) EXPECT_TRUE(f.get().ok());
  client_ = Open();
  auto listed = client_->List("drain");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 1u);
}

TEST(SafetensorsTest, RankFileNames) {
  EXPECT_EQ(RankFileName("out/model.safetensors", 0, 1), "out/model.safetensors");
  EXPECT_EQ(RankFileName("out/model.safetensors", 3, 4), "out/model.rank3.safetensors");
  EXPECT_EQ(RankFileName("out.d/model", 1, 2), "out.d/model.rank1");
  EXPECT_EQ(RankFileName(".hidden", 1, 2), ".hidden.rank1");
}

TEST(SafetensorsTest, HeaderIsAlignedAndPrefixed) {
  CheckpointInfo c;
  c.job = "j";
  c.step = 4;
  ShardInfo s;
  TensorInfo t;
  t.spec = TensorSpec{"w", DType::kBF16, {2, 3}, 12, "", 0, 0, "ab"};
  s.tensors.push_back(t);
  s.raw_bytes = 12;
  auto h = SafetensorsHeader(c, s);
  ASSERT_TRUE(h.ok());
  ASSERT_GE(h->size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>((*h)[i])) << (8 * i);
  EXPECT_EQ(n + 8, h->size());
  EXPECT_EQ(h->size() % 8, 0u);
  EXPECT_NE(h->find("\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}"),
            std::string::npos) << *h;
  s.raw_bytes = 13;  // inconsistent manifest
  EXPECT_EQ(SafetensorsHeader(c, s).status().code(), absl::StatusCode::kDataLoss);
}

// The one writer and the one reader of the header: exact bytes, a round trip, and damage.
TEST(SafetensorsTest, HeaderBytesReadBackAndDamageIsDataLoss) {
  const std::string h = EncodeSafetensorsHeader(
      {{"format", "x"}, {"k", "a\"b"}},
      {{"t", DType::kF32, {2}, 8}, {"u", DType::kU8, {3, 1}, 3}});
  const std::string json =
      "{\"__metadata__\":{\"format\":\"x\",\"k\":\"a\\\"b\"},"
      "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"u\":{\"dtype\":\"U8\",\"shape\":[3,1],\"data_offsets\":[8,11]}}";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  ASSERT_EQ(h.substr(8), padded);
  EXPECT_EQ(static_cast<unsigned char>(h[0]), padded.size());
  EXPECT_EQ(h.substr(1, 7), std::string(7, '\0'));

  const std::string file = h + std::string(11, 'p');
  auto r = ParseSafetensors(file, "f");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->data_start, h.size());
  EXPECT_EQ(r->metadata, (std::map<std::string, std::string>{{"format", "x"}, {"k", "a\"b"}}));
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors["t"].dtype, DType::kF32);
  EXPECT_EQ(r->tensors["t"].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(r->tensors["u"].dtype, DType::kU8);
  EXPECT_EQ(r->tensors["u"].shape, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(r->tensors["u"].begin, 8u);
  EXPECT_EQ(r->tensors["u"].end, 11u);

  auto with_json = [](const std::string& j) {
    std::string f(8, '\0');
    for (int i = 0; i < 8; ++i) f[i] = static_cast<char>((j.size() >> (8 * i)) & 0xff);
    return f + j;
  };
  for (const std::string& bad :
       {std::string("1234567"), file.substr(0, h.size() - 1), with_json("[]"), with_json("{"),
        with_json("{\"t\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,0]}}"),
        with_json("{\"t\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}"),
        with_json("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}")}) {
    EXPECT_EQ(ParseSafetensors(bad, "f").status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

TEST(ResolveShardSpecTest, FillsAndChecks) {
  TestShard s = MakeShard(2, 0, 0);
  ShardSpec spec;
  spec.job = "j";
  auto r = ResolveShardSpec(spec, s.Refs());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tensors.size(), s.tensors.size());
  auto again = ResolveShardSpec(*r, s.Refs());
  EXPECT_TRUE(again.ok());
  std::vector<TensorRef> refs = s.Refs();
  refs[1].data = nullptr;
  EXPECT_EQ(ResolveShardSpec(spec, refs).status().code(), absl::StatusCode::kInvalidArgument);
  refs = s.Refs();
  refs[0].spec.name = "../etc";
  EXPECT_EQ(ResolveShardSpec(spec, refs).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace client
}  // namespace gradsnap

namespace gradsnap {
namespace client {
namespace {

// A restarted attempt persisting a committed step again: the same content is idempotent, other
// content is a reported conflict (ALREADY_EXISTS), and the stored checkpoint stays as it was.
TEST(EmbeddedClientIdempotenceTest, RePersistSameContentOkOtherContentConflict) {
  gradsnap::testing::TempDir dir("idem");
  ClientOptions o;
  o.local_dir = dir.path();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto first = testing::SaveTestCheckpoint(**c, "j", 7, 1, 11, 64 << 10);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*c)->BeginCheckpoint(first->spec).ok());
  ShardSpec spec;
  spec.job = "j";
  spec.step = 7;
  spec.rank = 0;
  spec.metadata = first->shards[0].metadata;
  EXPECT_TRUE((*c)->SaveShard(spec, first->shards[0].Refs()).ok());
  testing::TestShard other = testing::MakeShard(12, 0, 64 << 10);
  other.metadata = first->shards[0].metadata;
  absl::Status conflict = (*c)->SaveShard(spec, other.Refs());
  EXPECT_EQ(conflict.code(), absl::StatusCode::kAlreadyExists) << conflict;
  EXPECT_NE(conflict.message().find("different content"), absl::string_view::npos) << conflict;
  EXPECT_TRUE((*c)->Verify("j", 7).ok());
  ExpectRestores(**c, *first);
  c->reset();
}

}  // namespace
}  // namespace client
}  // namespace gradsnap
