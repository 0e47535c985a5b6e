// Writer epochs (storage/epoch.h): AcquireEpoch counts up durably per job; requests carrying an
// older epoch are refused as superseded at begin, at writer open and at commit; epoch 0 is
// unfenced; a committed shard re-persisted by a newer attempt with the same spec is idempotent.
#include "storage/epoch.h"

#include <filesystem>
#include <vector>

#include "common/status.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/rebuild.h"
#include "storage/test_util.h"
#include "tests/testing/gtest_util.h"

namespace gradsnap {
namespace storage {
namespace {

class EpochTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> Open() {
    EngineOptions o;
    o.data_dir = dir_.path();
    return gradsnap::testing::ValueOrNull(Engine::Open(o));
  }
  static CheckpointSpec Ckpt(int64_t step, uint64_t epoch) {
    CheckpointSpec c;
    c.job = "j";
    c.step = step;
    c.world_size = 1;
    c.epoch = epoch;
    return c;
  }
  // A new attempt of job j: takes its epoch into *epoch, begins step 1 in it, and makes in
  // *shard rank 0's shard of that step (MakeShard seed 7, `w_numel`) carrying the epoch.
  static void BeginAttempt(Engine* e, int64_t w_numel, uint64_t* epoch, ShardData* shard) {
    *epoch = *e->AcquireEpoch("j");
    ASSERT_TRUE(e->BeginCheckpoint(Ckpt(1, *epoch)).ok());
    *shard = MakeShard("j", 1, 0, 7, w_numel);
    shard->spec.epoch = *epoch;
  }
  // A zombie: begins an attempt (into *old_epoch, *shard), writes its shard whole, and
  // finishes it after the next attempt took *new_epoch. Returns what Finish answered.
  static absl::Status FinishAfterANewerAttempt(Engine* e, uint64_t* old_epoch, ShardData* shard,
                                               uint64_t* new_epoch) {
    BeginAttempt(e, 1000, old_epoch, shard);
    auto w = e->OpenShardWriter(shard->spec);
    RETURN_IF_ERROR(w.status());
    std::vector<uint8_t> bytes = shard->stream();
    RETURN_IF_ERROR((*w)->Append(bytes.data(), bytes.size()));
    ASSIGN_OR_RETURN(*new_epoch, e->AcquireEpoch("j"));
    return (*w)->Finish();
  }
  TempDir dir_;
};

TEST_F(EpochTest, CountsUpPerJobAndSurvivesReopen) {
  auto e = Open();
  const uint64_t before = static_cast<uint64_t>(UnixMillis());
  const uint64_t first = *e->AcquireEpoch("j");
  EXPECT_GE(first, before);  // at least the wall clock in ms
  const uint64_t second = *e->AcquireEpoch("j");
  EXPECT_GT(second, first);
  EXPECT_GE(*e->AcquireEpoch("other"), before);
  e.reset();
  e = Open();
  EXPECT_GT(*e->AcquireEpoch("j"), second);
  EXPECT_EQ(e->AcquireEpoch("bad/name").status().code(), absl::StatusCode::kInvalidArgument);
  // The epoch key is not a job's checkpoint.
  EXPECT_EQ(e->ListJobs()->size(), 0u);
}

// RaiseEpoch takes no epoch of its own: it lifts a job's counter to a value another node handed
// out, never lowers it, and the next AcquireEpoch counts on from there, also after a reopen.
TEST_F(EpochTest, RaiseLiftsButNeverLowers) {
  auto e = Open();
  const uint64_t high = uint64_t{1} << 50;  // far above the clock
  EXPECT_EQ(*e->RaiseEpoch("j", high), high);
  EXPECT_EQ(*e->RaiseEpoch("j", 3), high);
  EXPECT_EQ(*e->RaiseEpoch("j", high), high);
  EXPECT_EQ(e->BeginCheckpoint(Ckpt(1, high - 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(e->BeginCheckpoint(Ckpt(1, high)).ok());
  e.reset();
  e = Open();
  EXPECT_EQ(*e->AcquireEpoch("j"), high + 1);
  EXPECT_EQ(e->RaiseEpoch("bad/name", 2).status().code(), absl::StatusCode::kInvalidArgument);
  // Epochs stop at kMaxEpoch: never wrapping around to 0, which is unfenced.
  EXPECT_EQ(e->RaiseEpoch("j", kMaxEpoch + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*e->RaiseEpoch("j", kMaxEpoch), kMaxEpoch);
  EXPECT_EQ(e->AcquireEpoch("j").status().code(), absl::StatusCode::kFailedPrecondition);
}

// A shard's durable prefix carries the epoch that wrote it: a writer of a newer attempt is told
// there is nothing to resume and starts the shard over, so the committed shard never mixes two
// attempts' bytes. The writer of the same attempt resumes as before.
TEST_F(EpochTest, NewerAttemptStartsAnOlderAttemptsShardOver) {
  auto e = Open();
  uint64_t first = 0;
  ShardData old_data;
  ASSERT_NO_FATAL_FAILURE(BeginAttempt(e.get(), 300000, &first, &old_data));
  const std::vector<uint8_t> old_bytes = old_data.stream();
  const size_t cut = old_bytes.size() / 2;
  {
    auto w = e->OpenShardWriter(old_data.spec);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(old_bytes.data(), cut).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  const uint64_t durable = *e->ShardCommittedSize("j", 1, 0);
  ASSERT_GT(durable, 0u);
  EXPECT_EQ(*e->ShardCommittedSize("j", 1, 0, first), durable);  // its own attempt resumes
  const uint64_t second = *e->AcquireEpoch("j");
  EXPECT_EQ(*e->ShardCommittedSize("j", 1, 0, second), 0u);
  ShardData new_data = MakeShard("j", 1, 0, 8, 300004);  // its spec differs too
  new_data.spec.epoch = second;
  const std::vector<uint8_t> new_bytes = new_data.stream();
  {
    auto w = e->OpenShardWriter(new_data.spec);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->written_size(), 0u);
    ASSERT_TRUE((*w)->Append(new_bytes.data(), new_bytes.size()).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  e.reset();
  e = Open();  // and it holds after a reopen: nothing of attempt 1 came back
  ExpectRestores(e.get(), new_data);
  EXPECT_TRUE(e->Verify("j", 1).ok());
}

TEST_F(EpochTest, OlderEpochIsRefusedEverywhere) {
  auto e = Open();
  uint64_t old_epoch = 0, new_epoch = 0;
  ShardData d;
  // The zombie's commit, its next begin and its next writer are all refused.
  absl::Status commit = FinishAfterANewerAttempt(e.get(), &old_epoch, &d, &new_epoch);
  EXPECT_TRUE(IsSuperseded(commit)) << commit;
  EXPECT_NE(commit.message().find(absl::StrCat("superseded by attempt ", new_epoch)),
            absl::string_view::npos)
      << commit;
  EXPECT_TRUE(IsSuperseded(e->BeginCheckpoint(Ckpt(2, old_epoch))));
  EXPECT_TRUE(IsSuperseded(e->OpenShardWriter(d.spec).status()));
  EXPECT_TRUE(e->ListCheckpoints("j")->empty());

  // The new attempt writes the same step; unfenced requests (epoch 0) still work.
  ASSERT_TRUE(e->BeginCheckpoint(Ckpt(1, new_epoch)).ok());
  d.spec.epoch = new_epoch;
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  EXPECT_EQ(e->ListCheckpoints("j")->size(), 1u);
  EXPECT_TRUE(e->BeginCheckpoint(Ckpt(1, 0)).ok());
}

TEST_F(EpochTest, RePersistOfACommittedShardIsIdempotent) {
  auto e = Open();
  const uint64_t first = *e->AcquireEpoch("j");
  ShardData d = MakeShard("j", 5, 0, 9, 1000);
  d.spec.epoch = first;
  ASSERT_TRUE(e->BeginCheckpoint(Ckpt(5, first)).ok());
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  const uint64_t second = *e->AcquireEpoch("j");
  d.spec.epoch = second;
  EXPECT_TRUE(e->BeginCheckpoint(Ckpt(5, second)).ok());
  EXPECT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  EXPECT_TRUE(e->Verify("j", 5).ok());
  ExpectRestores(e.get(), d);
}

// Delete and Gc are fenced like AbortCheckpoint: a zombie of an older attempt deletes nothing,
// also through GcSteps (the remote client's gc); 0 is unfenced (the CLI). Before, neither took
// an epoch and a zombie's retention ran against the new attempt's checkpoints.
TEST_F(EpochTest, DeleteAndGcOfAnOlderEpochAreRefused) {
  auto e = Open();
  uint64_t old_epoch = 0;
  ShardData d;
  ASSERT_NO_FATAL_FAILURE(BeginAttempt(e.get(), 1000, &old_epoch, &d));
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  ASSERT_TRUE(e->BeginCheckpoint(Ckpt(2, old_epoch)).ok());
  ShardData d2 = MakeShard("j", 2, 0, 8, 1000);
  d2.spec.epoch = old_epoch;
  ASSERT_TRUE(e->WriteShard(d2.spec, d2.ptrs()).ok());
  const uint64_t new_epoch = *e->AcquireEpoch("j");
  EXPECT_TRUE(IsSuperseded(e->Delete("j", 1, old_epoch)));
  EXPECT_TRUE(IsSuperseded(e->Gc("j", GcPolicy{1, 0}, old_epoch).status()));
  EXPECT_TRUE(IsSuperseded(e->GcSteps("j", {1}, old_epoch).status()));
  EXPECT_EQ(e->ListCheckpoints("j")->size(), 2u);
  auto gc = e->Gc("j", GcPolicy{1, 0}, new_epoch);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->deleted_steps, std::vector<int64_t>{1});
  EXPECT_TRUE(e->Delete("j", 2, /*epoch=*/0).ok());
  EXPECT_TRUE(e->ListCheckpoints("j")->empty());
}

// A writer superseded before its commit writes no shard footer, so a rebuild of a lost catalog
// cannot bring the zombie's shard back as committed. Before, the footer went to disk ahead of
// the refused commit, and the rebuild listed the zombie's checkpoint.
TEST_F(EpochTest, SupersededWriterLeavesNoFooterForARebuild) {
  {
    auto e = Open();
    uint64_t old_epoch = 0, new_epoch = 0;
    ShardData d;
    EXPECT_TRUE(IsSuperseded(FinishAfterANewerAttempt(e.get(), &old_epoch, &d, &new_epoch)));
  }
  std::filesystem::remove_all(dir_.path() + "/meta");
  EngineOptions o;
  o.data_dir = dir_.path();
  auto report = RebuildCatalog(o, /*dry_run=*/false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->rebuilt.empty()) << report->rebuilt.size() << " brought back";
  ASSERT_EQ(report->skipped.size(), 1u);
  EXPECT_NE(report->skipped[0].find("job j step 1: no shard footer"), std::string::npos)
      << report->skipped[0];
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
