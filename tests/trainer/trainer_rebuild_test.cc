// A lost catalog does not lose training: a run dies after checkpointing steps 2 and 4, its
// engine directory loses meta/, the trainer refuses to start on it (one line naming
// --rebuild-catalog, nothing deleted), `gradsnap fsck --rebuild` restores the catalog from the
// segments, and the resumed run ends bit-identical to an uninterrupted one.
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_util.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kTrain = GRADSNAP_TRAIN_BIN;
const std::string kCli = GRADSNAP_CLI_BIN;
const std::string kArgs =
    " --model tiny --batch 8 --seed 5 --steps 8 --nproc 1 --ckpt-mode sync --ckpt-every 2";

int CountFiles(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file()) ++n;
  }
  return n;
}

TEST(TrainerRebuildTest, ResumeIsExactAfterTheCatalogIsRebuilt) {
  const std::string d = FreshDir("rebuild");
  const RunResult full = RunCommand(kTrain + kArgs + " --ckpt-dir " + d + "/a");
  ASSERT_EQ(full.exit_code, 0) << full.output;

  const std::string b = d + "/b";
  const RunResult died =
      RunCommand(kTrain + kArgs + " --ckpt-dir " + b + " --fail-at-step 5 --fail-rank 0");
  ASSERT_NE(died.exit_code, 0) << died.output;
  std::filesystem::remove_all(b + "/meta");
  const int segments = CountFiles(b + "/segments");
  ASSERT_GT(segments, 0);

  const RunResult refused =
      RunCommand(kTrain + kArgs + " --ckpt-dir " + b + " --resume latest");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("--rebuild-catalog"), std::string::npos) << refused.output;
  EXPECT_EQ(CountFiles(b + "/segments"), segments);
  EXPECT_FALSE(std::filesystem::exists(b + "/meta"));

  const RunResult fsck = RunCommand(kCli + " --ckpt-dir " + b + " fsck --rebuild");
  ASSERT_EQ(fsck.exit_code, 0) << fsck.output;
  EXPECT_NE(fsck.output.find("rebuilt    job job step 4 (FULL, 1 shard)"), std::string::npos)
      << fsck.output;

  const RunResult resumed =
      RunCommand(kTrain + kArgs + " --ckpt-dir " + b + " --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(SummaryField(resumed.output, "resumed_from"), "4") << resumed.output;
  EXPECT_EQ(SummaryField(full.output, "params_sha256"),
            SummaryField(resumed.output, "params_sha256"));
  const auto a = ParseLosses(full.output), r = ParseLosses(resumed.output);
  for (int s = 5; s <= 8; ++s) EXPECT_EQ(a.at(s), r.at(s)) << "step " << s;
}

// The launcher's rollback of a failed attempt's PENDING checkpoints: a PENDING FULL takes its
// PENDING DELTA with it, and the rollback goes on (no NOT_FOUND for the DELTA).
TEST(TrainerRebuildTest, RollbackOfAPendingFullWithAPendingDelta) {
  const std::string d = FreshDir("rollback");
  {
    client::ClientOptions o;
    o.local_dir = d + "/store";
    auto c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client::CheckpointSpec full;
    full.job = "job";
    full.step = 40;
    ASSERT_TRUE((*c)->BeginCheckpoint(full).ok());
    client::CheckpointSpec delta = full;
    delta.step = 41;
    delta.kind = client::CheckpointKind::kDelta;
    delta.base_step = 40;
    ASSERT_TRUE((*c)->BeginCheckpoint(delta).ok());
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
  const RunResult r = RunCommand(kTrain + kArgs + " --ckpt-dir " + d +
                                 "/store --fail-at-step 3 --fail-rank 0 --max-restarts 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rolled back 1 pending checkpoint(s)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rolling back pending checkpoints:"), std::string::npos) << r.output;
  client::ClientOptions o;
  o.local_dir = d + "/store";
  auto c = client::Client::Connect(o);
  ASSERT_TRUE(c.ok());
  auto all = (*c)->List("job", /*include_pending=*/true);
  ASSERT_TRUE(all.ok());
  for (const auto& info : *all) EXPECT_LT(info.step, 40) << "step " << info.step << " left";
}

// Input files are read with a bound: a device or a directory is one clear error, not an
// endless read ending in bad_alloc.
TEST(TrainerRebuildTest, DataFromADeviceOrDirectoryIsAClearError) {
  const std::string d = FreshDir("baddata");
  for (const std::string& data : {std::string("/dev/zero"), d}) {
    const RunResult r = RunCommand(kTrain + " --model tiny --steps 1 --data " + data);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("data file " + data + " is"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
