// gradsnap-train --replicas over a static --storage list, with real processes: a job saves
// every shard on 2 of 3 real gradsnap-servers, and with any one of them SIGKILLed afterwards
// the job resumes from the rest, exactly (the parameters of an uninterrupted run). With one
// copy (the trainer before --replicas), the node that held a rank's only copy takes the resume
// down with it. Bad --replicas values are one line and exit 2.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kTrain = GRADSNAP_TRAIN_BIN;
const std::string kModel = " --model tiny --batch 4 --seq 16 --steps 24 --nproc 2";

TEST(TrainerReplicas, ResumesExactlyWithAnyOneOfThreeServersKilled) {
  TempDir dir;
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
    ASSERT_TRUE(servers.back()->StartOn(dir.File(absl::StrCat("node", i))).ok());
    addresses.push_back(servers.back()->address());
  }
  const std::string store =
      absl::StrCat(" --job j --storage ", absl::StrJoin(addresses, ","), " --replicas 2");
  const RunResult reference = RunTrainer(kTrain, kModel);
  ASSERT_EQ(reference.exit_code, 0) << reference.out;
  // Checkpoints every 4 steps; rank 1 dies at step 14 once one is committed (no restarts).
  const RunResult first =
      RunTrainer(kTrain, kModel + store +
                             " --ckpt-mode sync --ckpt-every 4 --fail-at-step 14 --fail-rank 1"
                             " --test-fail-after-commit");
  ASSERT_NE(first.exit_code, 0) << first.out;
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(absl::StrCat("server ", k, " (", addresses[k], ") killed"));
    servers[k]->Kill();
    const RunResult resumed = RunTrainer(kTrain, kModel + store + " --resume latest");
    EXPECT_TRUE(ResumedExactly(reference.out, resumed.out, 12).ok())
        << ResumedExactly(reference.out, resumed.out, 12) << "\n" << resumed.out;
    ASSERT_TRUE(servers[k]->Restart().ok()) << servers[k]->Log();
  }
}

TEST(TrainerReplicas, BadReplicasIsOneLineAndExit2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --storage 127.0.0.1:1,127.0.0.1:2 --replicas 3",
       "--replicas 3 needs at least as many --storage endpoints (2 given)"},
      {" --replicas 2", "--replicas applies to --storage endpoints only"},
      {" --storage 127.0.0.1:1 --replicas 0", "--replicas must be in [1, 16]"},
      {" --storage 127.0.0.1:1 --replicas x", "bad value 'x' for --replicas"},
  };
  for (const auto& [args, line] : cases) {
    const RunResult r = RunTrainer(kTrain, kModel + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out;
    EXPECT_EQ(CountLines(r.out), 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(line), std::string::npos) << args << "\n" << r.out;
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
