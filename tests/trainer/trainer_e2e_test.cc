// gradsnap-train end to end: learning, data parallelism, exact resume after a rank failure,
// and bad input. Each test runs the real binary (launcher + ranks) on the tiny model.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/test_util.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"
#include "tests/testing/trainer.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kTrain = GRADSNAP_TRAIN_BIN;
const std::string kTiny = " --model tiny --batch 8 --seed 5";

RunResult Train(const std::string& args) { return RunTrainer(kTrain, kTiny + " " + args); }

TEST(TrainerE2eTest, LossFallsOnDefaultCorpus) {
  const RunResult r = Train("--steps 40 --lr 2e-3");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto losses = ParseLosses(r.out);
  ASSERT_EQ(losses.size(), 40u);
  const double first = std::stod(losses.at(1));
  double last5 = 0;
  for (int s = 36; s <= 40; ++s) last5 += std::stod(losses.at(s)) / 5;
  EXPECT_GT(first, 5.0);        // ~ln(256) = 5.55 at initialization
  EXPECT_LT(last5, first - 1.5) << r.out;
  EXPECT_EQ(SummaryField(r.out, "params_sha256").size(), 64u);
}

TEST(TrainerE2eTest, DeterministicForSameSeedAndWorldSize) {
  const RunResult a = Train("--steps 5"), b = Train("--steps 5");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_EQ(SummaryField(a.out, "params_sha256"), SummaryField(b.out, "params_sha256"));
  const RunResult c = Train("--steps 5 --seed 6");
  EXPECT_NE(SummaryField(a.out, "params_sha256"), SummaryField(c.out, "params_sha256"));
}

// The CPU back end splits every layer, the optimizer and the gradient norm so that each result
// is computed by one thread in one order (docs/trainer.md, "Numerics"): 1, 2 and 3 threads per
// rank train to the same bits, also with two ranks. The default (0, cores per rank) too.
TEST(TrainerE2eTest, ThreadCountsTrainToTheSameBits) {
  for (int nproc : {1, 2}) {
    const std::string args = absl::StrCat("--steps 6 --nproc ", nproc);
    const RunResult one = Train(args + " --blas-threads 1");
    ASSERT_EQ(one.exit_code, 0) << one.out;
    const std::string sha = SummaryField(one.out, "params_sha256");
    ASSERT_EQ(sha.size(), 64u) << one.out;
    for (const char* threads : {"2", "3", "0"}) {
      const RunResult r = Train(args + " --blas-threads " + threads);
      ASSERT_EQ(r.exit_code, 0) << r.out;
      EXPECT_EQ(SummaryField(r.out, "params_sha256"), sha) << nproc << " rank(s), " << threads
                                                           << " threads";
      EXPECT_EQ(ParseLosses(r.out), ParseLosses(one.out)) << nproc << " rank(s), " << threads;
    }
  }
}

// Same global batch, different reduction order: losses agree to 1e-4 (stated tolerance;
// observed differences are below 1e-6 on this model).
TEST(TrainerE2eTest, TwoRanksMatchOneRank) {
  const RunResult one = Train("--steps 12 --nproc 1");
  const RunResult two = Train("--steps 12 --nproc 2");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  ASSERT_EQ(two.exit_code, 0) << two.out;
  const auto l1 = ParseLosses(one.out), l2 = ParseLosses(two.out);
  ASSERT_EQ(l1.size(), 12u);
  ASSERT_EQ(l2.size(), 12u);
  for (const auto& [step, loss] : l1) {
    EXPECT_NEAR(std::stod(loss), std::stod(l2.at(step)), 1e-4) << "step " << step;
  }
}

// An uninterrupted run and a run whose rank dies at step 5 (restarted by the launcher from the
// checkpoint of step 4) end bit-identical, with identical losses after the resume point.
void ExpectExactResume(int nproc, const std::string& store_args_a,
                       const std::string& store_args_b) {
  const std::string common = absl::StrCat("--steps 8 --nproc ", nproc,
                                          " --ckpt-mode sync --ckpt-every 2 ");
  const RunResult full = Train(common + store_args_a);
  ASSERT_EQ(full.exit_code, 0) << full.out;
  const RunResult failed = Train(common + store_args_b + absl::StrCat(
      " --fail-at-step 5 --fail-rank ", nproc - 1, " --max-restarts 2"));
  ASSERT_EQ(failed.exit_code, 0) << failed.out;
  EXPECT_NE(failed.out.find("restart 1 of 2"), std::string::npos) << failed.out;
  const absl::Status exact = ResumedExactly(full.out, failed.out, 4);
  EXPECT_TRUE(exact.ok()) << exact << "\n" << failed.out;
}

TEST(TrainerE2eTest, ResumeIsExactEmbeddedOneRank) {
  const TempDir tmp("resume1");
  const std::string d = tmp.path();
  ExpectExactResume(1, "--ckpt-dir " + d + "/a", "--ckpt-dir " + d + "/b");
}

TEST(TrainerE2eTest, ResumeIsExactEmbeddedTwoRanks) {
  const TempDir tmp("resume2");
  const std::string d = tmp.path();
  ExpectExactResume(2, "--ckpt-dir " + d + "/a", "--ckpt-dir " + d + "/b");
}

// The same drill with checkpoints on a real gradsnap-server process (remote back end).
// And on a cluster (--etcd): a 1-member etcd and 3 gradsnap-servers registered in it; each
// rank's shard on 3 nodes, the catalog and the epochs in etcd.
TEST(TrainerE2eTest, ResumeIsExactOnACluster) {
  const TempDir tmp("cluster");
  const std::string d = tmp.path();
  EtcdCluster etcd(tmp.Sub("etcd"));
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
    auto address = StartClusterNode(servers.back().get(), absl::StrCat(d, "/node", i),
                                    etcd.Endpoints());
    ASSERT_TRUE(address.ok()) << address.status();
  }
  ExpectExactResume(2, "--job full --etcd " + etcd.Endpoints(),
                    "--job drill --etcd " + etcd.Endpoints());
  const RunResult ls = RunProgram(GRADSNAP_CLI_BIN, {"--etcd", etcd.Endpoints(), "ls", "drill"}, 60);
  EXPECT_EQ(ls.exit_code, 0) << ls.out << ls.err;
  EXPECT_NE(ls.out.find("committed"), std::string::npos) << ls.out;
}

TEST(TrainerE2eTest, ResumeIsExactWithServer) {
  const TempDir tmp("server");
  const std::string d = tmp.path();
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(d + "/data").ok()) << server.Log();
  ExpectExactResume(2, "--job full --storage " + server.address(),
                    "--job drill --storage " + server.address());
}

TEST(TrainerE2eTest, BadInputIsAClearError) {
  const TempDir tmp("bad");
  const std::string d = tmp.path();
  struct Case {
    std::string args, message;
  };
  { std::ofstream(d + "/empty.txt").flush(); }
  const std::vector<Case> cases = {
      {"--data " + d + "/missing.txt", "does not exist"},
      {"--data " + d + "/empty.txt", "is empty"},
      {"--model gpt9", "unknown model 'gpt9'"},
      {"--nproc 0", "--nproc must be in [1, 1024]"},
      {"--ckpt-mode bogus --ckpt-every 1", "unknown --ckpt_mode"},
      {"--resume yesterday", "--resume must be"},
      {"--batch 3 --nproc 2", "--batch must be"},
      {"--blas-threads -1", "--blas_threads must be in [0, 1024]"},
      {"--rdzv " + d + "/empty.txt/rdzv", "cannot create the rendezvous directory"},
  };
  for (const Case& c : cases) {
    const RunResult r = Train("--steps 2 " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.out;  // refused: no restart helps
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.args << ": " << r.out;
    EXPECT_EQ(r.out.find("step 1 "), std::string::npos) << c.args;
  }
}

TEST(TrainerE2eTest, HelpListsTheFlags) {
  const RunResult r = RunTrainer(kTrain, " --help");  // absl's --help exits 1, like the server
  EXPECT_EQ(r.out.find("step 1 "), std::string::npos);
  for (const char* flag : {"--ckpt_mode", "--nproc", "--fail_at_step", "--resume", "--storage"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
}

// On a machine without a GPU (or a build without CUDA), --device cuda is one clear error.
TEST(TrainerE2eTest, CudaWithoutGpuIsAClearError) {
  const RunResult r = Train("--steps 2 --device cuda");
  if (r.exit_code == 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_NE(r.out.find("--device cuda"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1 "), std::string::npos);
}

TEST(TrainerE2eTest, CheckpointOfAnotherModelIsRefusedAndKept) {
  const TempDir tmp("othermodel");
  const std::string d = tmp.path();
  const std::string store = " --ckpt-mode sync --ckpt-every 2 --ckpt-dir " + d + "/ck";
  const RunResult first = Train("--steps 4" + store);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  auto manifest_of = [&](int64_t step) {
    auto c = client::testing::ConnectLocal(d + "/ck");
    EXPECT_TRUE(c.ok()) << c.status();
    auto list = (*c)->List("job");
    std::string out;
    for (const auto& i : *list) absl::StrAppend(&out, i.step, ":", i.raw_bytes, ";");
    auto m = (*c)->Show("job", step);
    for (const auto& s : m->shards) {
      for (const auto& t : s.tensors) absl::StrAppend(&out, t.spec.name, "=", t.spec.sha256, ";");
    }
    return out;
  };
  const std::string before = manifest_of(4);
  // Same job, a different model: refused before any step, exit non-zero, nothing written.
  const RunResult other = RunTrainer(kTrain,
                                     " --model small --seq 32 --batch 8 --steps 6 "
                                     "--resume latest" +
                                         store);
  EXPECT_NE(other.exit_code, 0) << other.out;
  EXPECT_NE(other.out.find("checkpoint does not match this run: model"), std::string::npos)
      << other.out;
  EXPECT_EQ(other.out.find("step 5 "), std::string::npos);
  EXPECT_EQ(manifest_of(4), before);
  // A fresh run of the same job is refused too, before any step.
  const RunResult fresh = Train("--steps 6" + store);
  EXPECT_NE(fresh.exit_code, 0) << fresh.out;
  EXPECT_NE(fresh.out.find("already has checkpoints"), std::string::npos) << fresh.out;
  EXPECT_EQ(manifest_of(4), before);
  // The right model still resumes from it.
  const RunResult same = Train("--steps 6 --resume latest" + store);
  ASSERT_TRUE(IsOk(ResumedFrom(same, 4)));
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
