// A lost catalog does not lose training: a run dies after checkpointing steps 2 and 4, its
// engine directory loses meta/, the trainer refuses to start on it (one line naming
// --rebuild-catalog, nothing deleted), `gradsnap fsck --rebuild` restores the catalog from the
// segments, and the resumed run ends bit-identical to an uninterrupted one.
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/test_util.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kTrain = GRADSNAP_TRAIN_BIN;
const std::string kCli = GRADSNAP_CLI_BIN;
const std::string kArgs =
    " --model tiny --batch 8 --seed 5 --steps 8 --nproc 1 --ckpt-mode sync --ckpt-every 2";

TEST(TrainerRebuildTest, ResumeIsExactAfterTheCatalogIsRebuilt) {
  const TempDir tmp("rebuild");
  const std::string d = tmp.path();
  const RunResult full = RunTrainer(kTrain, kArgs + " --ckpt-dir " + d + "/a");
  ASSERT_EQ(full.exit_code, 0) << full.out;

  const std::string b = d + "/b";
  const RunResult died =
      RunTrainer(kTrain, kArgs + " --ckpt-dir " + b + " --fail-at-step 5 --fail-rank 0");
  ASSERT_NE(died.exit_code, 0) << died.out;
  std::filesystem::remove_all(b + "/meta");
  const int segments = CountFiles(b + "/segments");
  ASSERT_GT(segments, 0);

  const RunResult refused = RunTrainer(kTrain, kArgs + " --ckpt-dir " + b + " --resume latest");
  EXPECT_NE(refused.exit_code, 0) << refused.out;
  EXPECT_NE(refused.out.find("--rebuild-catalog"), std::string::npos) << refused.out;
  EXPECT_EQ(CountFiles(b + "/segments"), segments);
  EXPECT_FALSE(std::filesystem::exists(b + "/meta"));

  const RunResult fsck = RunCommand(kCli + " --ckpt-dir " + b + " fsck --rebuild");
  ASSERT_EQ(fsck.exit_code, 0) << fsck.out;
  EXPECT_NE(fsck.out.find("rebuilt    job job step 4 (FULL, 1 shard)"), std::string::npos)
      << fsck.out;

  const RunResult resumed = RunTrainer(kTrain, kArgs + " --ckpt-dir " + b + " --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  const absl::Status exact = ResumedExactly(full.out, resumed.out, 4);
  EXPECT_TRUE(exact.ok()) << exact << "\n" << resumed.out;
}

// The launcher's rollback of a failed attempt's PENDING checkpoints: a PENDING FULL takes its
// PENDING DELTA with it, and the rollback goes on (no NOT_FOUND for the DELTA).
TEST(TrainerRebuildTest, RollbackOfAPendingFullWithAPendingDelta) {
  const TempDir tmp("rollback");
  const std::string d = tmp.path();
  {
    auto c = client::testing::ConnectLocal(d + "/store");
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->BeginCheckpoint({"job", 40, client::CheckpointKind::kFull, -1, 1, ""}).ok());
    ASSERT_TRUE((*c)->BeginCheckpoint({"job", 41, client::CheckpointKind::kDelta, 40, 1, ""}).ok());
    std::string bytes(64, 'x');
    client::TensorRef t;
    t.spec.name = "g";
    t.spec.dtype = DType::kU8;
    t.spec.shape = {64};
    t.spec.byte_length = 64;
    t.data = bytes.data();
    client::ShardSpec spec;
    spec.job = "job";
    spec.step = 41;
    ASSERT_TRUE((*c)->SaveShard(spec, {t}).ok());
  }
  const RunResult r =
      RunTrainer(kTrain, kArgs + " --ckpt-dir " + d +
                             "/store --fail-at-step 3 --fail-rank 0 --max-restarts 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("rolled back 1 pending checkpoint(s)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rolling back pending checkpoints:"), std::string::npos) << r.out;
  auto c = client::testing::ConnectLocal(d + "/store");
  ASSERT_TRUE(c.ok());
  auto all = (*c)->List("job", /*include_pending=*/true);
  ASSERT_TRUE(all.ok());
  for (const auto& info : *all) EXPECT_LT(info.step, 40) << "step " << info.step << " left";
}

// Input files are read with a bound: a device or a directory is one clear error, not an
// endless read ending in bad_alloc.
TEST(TrainerRebuildTest, DataFromADeviceOrDirectoryIsAClearError) {
  const TempDir tmp("baddata");
  const std::string d = tmp.path();
  for (const std::string& data : {std::string("/dev/zero"), d}) {
    const RunResult r = RunTrainer(kTrain, " --model tiny --steps 1 --data " + data);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("data file " + data + " is"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
