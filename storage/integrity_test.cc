// Integrity and bad input: corrupt bytes and truncated or missing segments give DATA_LOSS naming
// job, step, rank and tensor, never wrong data; invalid specs give INVALID_ARGUMENT; GC and
// retention honour DELTA chains and reclaim the space.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/test_util.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace storage {
namespace {

namespace fs = std::filesystem;

class IntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.data_dir = dir_.path();
    o.chunk_bytes = 32 << 10;
    o.adapt_compression = false;
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void Write(int64_t step, CheckpointKind kind = CheckpointKind::kFull, int64_t base = -1) {
    ASSERT_TRUE(engine_->BeginCheckpoint({"ij", step, kind, base, 1, ""}).ok());
    ShardData d = MakeShard("ij", step, 0, step, 20000);
    ASSERT_TRUE(engine_->WriteShard(d.spec, d.ptrs()).ok());
  }
  std::vector<std::string> Segments(int64_t step) {
    return testing::SegmentFiles(dir_.path(), "ij", step);
  }
  static void FlipByte(const fs::path& p, uint64_t offset) {
    ASSERT_TRUE(testing::FlipByte(p.string(), offset, 0x10).ok());
  }
  // Every read path reports DATA_LOSS with the location, and never hands out the tensor.
  void ExpectDataLoss(int64_t step) {
    absl::Status v = engine_->Verify("ij", step);
    EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss) << v;
    EXPECT_NE(v.message().find("job ij step " + std::to_string(step) + " rank 0"),
              std::string::npos) << v;
    auto r = engine_->OpenShardReader("ij", step, 0);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
      return;
    }
    bool failed = false;
    for (size_t i = 0; i < (*r)->info().tensors.size(); ++i) {
      std::vector<uint8_t> out((*r)->info().tensors[i].spec.byte_length);
      absl::Status s = (*r)->ReadTensor(i, out.data(), out.size());
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
        EXPECT_NE(s.message().find("tensor " + (*r)->info().tensors[i].spec.name),
                  std::string::npos) << s;
        failed = true;
      }
    }
    EXPECT_TRUE(failed);
  }

  TempDir dir_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(IntegrityTest, CorruptByteAnywhereIsDataLoss) {
  Write(1);
  fs::path seg = Segments(1).at(0);
  uint64_t size = fs::file_size(seg);
  // Headers of the first record, payload bytes all over the file.
  for (uint64_t off : {uint64_t{0}, uint64_t{5}, uint64_t{20}, uint64_t{39}, uint64_t{40},
                       size / 3, size / 2, size - 4097}) {
    SCOPED_TRACE(off);
    TempDir copy;
    FlipByte(seg, off);
    // Only bytes inside records matter; padding is never read as data.
    absl::Status v = engine_->Verify("ij", 1);
    if (v.ok()) {
      FlipByte(seg, off);
      continue;
    }
    ExpectDataLoss(1);
    FlipByte(seg, off);
    ASSERT_TRUE(engine_->Verify("ij", 1).ok());
  }
}

TEST_F(IntegrityTest, EveryRecordHeaderAndPayloadIsCovered) {
  Write(1);
  fs::path seg = Segments(1).at(0);
  auto m = engine_->GetManifest("ij", 1);
  ASSERT_TRUE(m.ok());
  // Records start on 4 KiB boundaries: corrupting the first byte of each must be detected.
  int detected = 0;
  for (uint64_t off = 0; off < fs::file_size(seg); off += 4096) {
    FlipByte(seg, off);
    if (!engine_->Verify("ij", 1).ok()) ++detected;
    FlipByte(seg, off);
  }
  uint32_t chunks = 0;
  for (const auto& t : m->shards[0].tensors) chunks += t.chunks;
  EXPECT_GE(detected, static_cast<int>(chunks));
}

TEST_F(IntegrityTest, TruncatedOrMissingSegmentIsDataLoss) {
  Write(1);
  Write(2);
  fs::path seg = Segments(1).at(0);
  fs::resize_file(seg, fs::file_size(seg) / 2);
  ExpectDataLoss(1);
  EXPECT_TRUE(engine_->Verify("ij", 2).ok());
  fs::remove(Segments(2).at(0));
  ExpectDataLoss(2);
  // Reopening does not hide the damage.
  engine_.reset();
  SetUp();
  ExpectDataLoss(1);
}

TEST_F(IntegrityTest, BadInputIsInvalidArgument) {
  auto bad = [&](const CheckpointSpec& c) { return engine_->BeginCheckpoint(c).code(); };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad({"a/b", 1, CheckpointKind::kFull, -1, 1, ""}), kInvalid);
  EXPECT_EQ(bad({"..", 1, CheckpointKind::kFull, -1, 1, ""}), kInvalid);
  EXPECT_EQ(bad({"", 1, CheckpointKind::kFull, -1, 1, ""}), kInvalid);
  EXPECT_EQ(bad({std::string(129, 'a'), 1, CheckpointKind::kFull, -1, 1, ""}), kInvalid);
  EXPECT_EQ(bad({"j", -1, CheckpointKind::kFull, -1, 1, ""}), kInvalid);
  EXPECT_EQ(bad({"j", 1, CheckpointKind::kFull, -1, 0, ""}), kInvalid);
  EXPECT_EQ(bad({"j", 1, static_cast<CheckpointKind>(9), -1, 1, ""}), kInvalid);
  EXPECT_EQ(bad({"j", 1, CheckpointKind::kDelta, 5, 1, ""}), kInvalid);
  EXPECT_EQ(bad({"j", 1, CheckpointKind::kFull, -1, 1, std::string((1 << 20) + 1, 'x')}),
            kInvalid);
  EXPECT_EQ(bad({"j", 3, CheckpointKind::kDelta, 2, 1, ""}),
            absl::StatusCode::kFailedPrecondition);  // no FULL at step 2

  ASSERT_TRUE(engine_->BeginCheckpoint({"j", 1, CheckpointKind::kFull, -1, 2, ""}).ok());
  ShardSpec s;
  s.job = "j";
  s.step = 1;
  s.tensors = {Tensor("t", DType::kF32, 10)};
  auto open = [&](const ShardSpec& spec) { return engine_->OpenShardWriter(spec).status().code(); };
  ShardSpec x = s;
  x.rank = 2;
  EXPECT_EQ(open(x), kInvalid);
  x = s;
  x.tensors[0].dtype = static_cast<DType>(77);
  EXPECT_EQ(open(x), kInvalid);
  x = s;
  x.tensors[0].byte_length = 41;
  EXPECT_EQ(open(x), kInvalid);
  x = s;
  x.tensors[0].shape = {-1};
  EXPECT_EQ(open(x), kInvalid);
  x = s;
  x.tensors[0].name = "bad name";
  EXPECT_EQ(open(x), kInvalid);
  x = s;
  x.tensors.push_back(x.tensors[0]);
  EXPECT_EQ(open(x), kInvalid);
  x = s;
  x.tensors[0].sha256 = "XYZ";
  EXPECT_EQ(open(x), kInvalid);
  x = s;
  x.step = 99;
  EXPECT_EQ(open(x), absl::StatusCode::kNotFound);

  auto w = engine_->OpenShardWriter(s);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(engine_->OpenShardWriter(s).status().code(), absl::StatusCode::kUnavailable);
  std::vector<uint8_t> data(41);
  EXPECT_EQ((*w)->Append(data.data(), 41).code(), kInvalid);
  EXPECT_EQ((*w)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*w)->Append(data.data(), 40).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  w->reset();
  // The same shard with another spec after it committed.
  x = s;
  x.metadata = "other";
  EXPECT_EQ(open(x), absl::StatusCode::kAlreadyExists);
  // An expected SHA-256 that does not match the bytes.
  s.rank = 1;
  s.tensors[0].sha256 = std::string(64, '0');
  EXPECT_EQ(engine_->WriteShard(s, {data.data()}).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(engine_->ListCheckpoints("j")->empty());
  EXPECT_EQ(engine_->OpenShardReader("j", 1, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->GetManifest("j", 7).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->ListCheckpoints("no/pe").status().code(), kInvalid);
}

// gc's keep_last counts FULLs that verify: with the newest FULL damaged, the one before it (the
// checkpoint `latest` falls back to) is kept, not deleted; with too few good FULLs nothing goes.
TEST_F(IntegrityTest, GcNeverDeletesWhatLatestFallsBackTo) {
  for (int64_t s : {10, 20, 30}) Write(s);
  ASSERT_GT(gradsnap::testing::FlipSegmentBytes(dir_.path(), "ij", 30, 0), 0);
  auto r = engine_->Gc("ij", GcPolicy{1, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, std::vector<int64_t>{10});  // 30 damaged, kept; 20 good, kept
  EXPECT_TRUE(engine_->Verify("ij", 20).ok());
  ASSERT_GT(gradsnap::testing::FlipSegmentBytes(dir_.path(), "ij", 20, 0), 0);
  r = engine_->Gc("ij", GcPolicy{1, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->deleted_steps.empty());  // no good FULL left: nothing is deleted
  EXPECT_EQ(engine_->ListCheckpoints("ij")->size(), 2u);
}

TEST_F(IntegrityTest, GcKeepsDeltaChainsAndReclaimsSpace) {
  // FULL 10, 20, 30, 40 with a DELTA on 20 and one on 40.
  for (int64_t s : {10, 20, 30, 40}) Write(s);
  Write(21, CheckpointKind::kDelta, 20);
  Write(41, CheckpointKind::kDelta, 40);
  EXPECT_EQ(engine_->Delete("ij", 20).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(fs::exists(dir_.path() + "/segments/ij/00000000000000000010"));

  auto r = engine_->Gc("ij", GcPolicy{2, 20});  // keep 30, 40 and every step % 20 == 0
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, std::vector<int64_t>{10});
  EXPECT_GT(r->bytes_reclaimed, 0u);
  EXPECT_FALSE(fs::exists(dir_.path() + "/segments/ij/00000000000000000010"));

  r = engine_->Gc("ij", GcPolicy{1, 0});  // keep 40 (and its DELTA 41)
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->deleted_steps, (std::vector<int64_t>{20, 21, 30}));
  std::vector<int64_t> left;
  auto listed = engine_->ListCheckpoints("ij");
  ASSERT_TRUE(listed.ok());
  for (const auto& c : *listed) left.push_back(c.step);
  EXPECT_EQ(left, (std::vector<int64_t>{40, 41}));
  EXPECT_TRUE(engine_->Verify("ij", 41).ok());
  for (int64_t s : {20, 21, 30}) {
    EXPECT_EQ(engine_->GetManifest("ij", s).status().code(), absl::StatusCode::kNotFound);
  }
  // Delete the DELTA, then its FULL may go.
  ASSERT_TRUE(engine_->Delete("ij", 41).ok());
  ASSERT_TRUE(engine_->Delete("ij", 40).ok());
  EXPECT_TRUE(engine_->ListCheckpoints("ij")->empty());
  EXPECT_TRUE(fs::is_empty(dir_.path() + "/segments/ij"));
}

// keep_every K keeps, for every multiple of K, the newest FULL at or before it: one FULL per K
// steps also where FULLs are not on multiples (gockpt ends a FULL's window after its start).
// Before, only FULLs whose step was a multiple were kept, so this kept none but the newest.
TEST_F(IntegrityTest, GcKeepEveryKeepsTheFullBeforeEachMultiple) {
  for (int64_t s : {5, 9, 13, 17, 21}) Write(s);
  Write(10, CheckpointKind::kDelta, 9);
  auto r = engine_->Gc("ij", GcPolicy{1, 8});  // 8 -> FULL 5, 16 -> FULL 13; 21 the newest
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, (std::vector<int64_t>{9, 10, 17}));
  auto listed = engine_->ListCheckpoints("ij");
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<int64_t> left;
  for (const auto& c : *listed) left.push_back(c.step);
  EXPECT_EQ(left, (std::vector<int64_t>{5, 13, 21}));
  // FULLs on multiples: exactly those (and the newest).
  for (int64_t s : {24, 32, 40}) Write(s);
  r = engine_->Gc("ij", GcPolicy{1, 16});  // 16 -> 13, 32 -> 32; 40 the newest
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, (std::vector<int64_t>{5, 21, 24}));
}

// A shard saved again while its checkpoint is still PENDING (rank 1 not written yet) is read
// back like one in a committed checkpoint: a damaged stored copy is DATA_LOSS naming the
// remedy, not counted as saved. (The read-back needed the checkpoint committed, and took its
// FAILED_PRECONDITION for success.)
TEST_F(IntegrityTest, ShardSavedAgainInAPendingCheckpointIsReadBack) {
  ASSERT_TRUE(engine_->BeginCheckpoint({"ij", 6, CheckpointKind::kFull, -1, 2, ""}).ok());
  ShardData d = MakeShard("ij", 6, 0, 6, 20000);
  ASSERT_TRUE(engine_->WriteShard(d.spec, d.ptrs()).ok());
  EXPECT_TRUE(engine_->WriteShard(d.spec, d.ptrs()).ok());  // intact: idempotent
  const std::vector<std::string> segs = Segments(6);
  ASSERT_FALSE(segs.empty());
  FlipByte(segs[0], 3000);
  absl::Status again = engine_->WriteShard(d.spec, d.ptrs());
  EXPECT_EQ(again.code(), absl::StatusCode::kDataLoss) << again;
  EXPECT_NE(again.message().find("does not read back"), std::string::npos) << again;
  auto size = engine_->ShardCommittedSize("ij", 6, 0, 0);
  EXPECT_EQ(size.status().code(), absl::StatusCode::kDataLoss) << size.status();
}

// GcSteps deletes the FULLs chosen elsewhere (the remote client's gc over several nodes),
// each with its DELTAs; a FULL not held committed here is skipped, and a DELTA asked for is
// refused before anything is deleted.
TEST_F(IntegrityTest, GcStepsDeletesTheChosenFullsWithTheirDeltas) {
  for (int64_t s : {10, 20, 30}) Write(s);
  Write(11, CheckpointKind::kDelta, 10);
  ASSERT_TRUE(engine_->BeginCheckpoint({"ij", 40, CheckpointKind::kFull, -1, 2, ""}).ok());
  auto r = engine_->GcSteps("ij", {10, 11});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(engine_->ListCheckpoints("ij")->size(), 4u);
  r = engine_->GcSteps("ij", {10, 30, 40, 50});  // 40 PENDING, 50 not here: both skipped
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, (std::vector<int64_t>{10, 11, 30}));
  auto listed = engine_->ListCheckpoints("ij", /*include_pending=*/true);
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<int64_t> left;
  for (const auto& c : *listed) left.push_back(c.step);
  EXPECT_EQ(left, (std::vector<int64_t>{20, 40}));
}

TEST_F(IntegrityTest, AbortAndPendingAreNeverListed) {
  ASSERT_TRUE(engine_->BeginCheckpoint({"ij", 5, CheckpointKind::kFull, -1, 2, ""}).ok());
  ShardData d = MakeShard("ij", 5, 0, 5, 1000);
  ASSERT_TRUE(engine_->WriteShard(d.spec, d.ptrs()).ok());
  EXPECT_TRUE(engine_->ListCheckpoints("ij")->empty());
  EXPECT_EQ(engine_->ListCheckpoints("ij", true)->size(), 1u);
  EXPECT_EQ(engine_->Verify("ij", 5).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine_->AbortCheckpoint("ij", 5).ok());
  EXPECT_TRUE(engine_->ListCheckpoints("ij", true)->empty());
  EXPECT_FALSE(fs::exists(dir_.path() + "/segments/ij/00000000000000000005"));
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
