// gradsnap-train on a cluster whose etcd loses its quorum while the job trains (docs/protocol.md,
// "Cluster mode"; docs/deploy.md, "What happens when ..."): a 3-member etcd and 3
// gradsnap-servers, all real processes made by the test on loopback, 2 of the 3 etcd members
// SIGKILLed mid-run and started again later.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

constexpr int64_t kSteps = 1000;
const std::string kModel = absl::StrCat(" --model tiny --batch 8 --seed 5 --nproc 2 --steps ",
                                        kSteps, " --blas-threads 1");

// The last step line the job printed so far (step 0 when none).
StepLine LastLine(const ChildProcess& job) { return LastStepLine(job); }

// Polls until the job printed a step line for which `cond` holds, or ended (false).
bool WaitForLine(ChildProcess& job, const std::function<bool(const StepLine&)>& cond) {
  for (;;) {
    if (cond(LastLine(job))) return true;
    if (job.Poll() >= 0) return cond(LastLine(job));
    SleepMs(20);
  }
}

// The step line of `step` (step -1 when the job printed none).
StepLine LineOf(const std::string& out, int64_t step) {
  for (const StepLine& l : ParseStepLines(out)) {
    if (l.step == step) return l;
  }
  return StepLine{.step = -1};
}

// Quorum lost for a stretch of the run: the job steps on (it neither stops nor restarts),
// every checkpoint of the stretch fails and is counted, no checkpoint commits and the recovery
// point ages; nothing incomplete is listed. Quorum back: checkpoints commit again, the job ends
// with the uninterrupted run's parameters, and a resume from a checkpoint committed after the
// outage is exact.
TEST(ClusterQuorum, TrainingOutlivesEtcdQuorumLoss) {
  TempDir tmp("quorum");
  EtcdCluster etcd(tmp.Sub("etcd"));
  ASSERT_TRUE(etcd.Start(3).ok()) << etcd.Log(0);
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
    auto address = StartClusterNode(servers.back().get(), tmp.File(absl::StrCat("node", i)),
                                    etcd.Endpoints(), {"--lease-ttl-s", "2"});
    ASSERT_TRUE(address.ok()) << address.status();
  }
  const RunResult reference = RunTrainer(GRADSNAP_TRAIN_BIN, kModel);
  ASSERT_EQ(reference.exit_code, 0) << reference.out;

  const std::string store = absl::StrCat(" --job q --etcd ", etcd.Endpoints(),
                                         " --ckpt-mode async --ckpt-every 5");
  std::vector<std::string> argv = {GRADSNAP_TRAIN_BIN};
  for (absl::string_view w : absl::StrSplit(
           kModel + store + " --max-restarts 0 --ckpt-persist-timeout-ms 1000"
                            " --test-step-delay-ms 20",
           ' ', absl::SkipEmpty())) {
    argv.emplace_back(w);
  }
  ChildProcess job;
  ASSERT_TRUE(job.Start(argv, tmp.File("job.log")).ok());

  // A checkpoint committed before the fault, and steps enough to measure the pace before.
  ASSERT_TRUE(WaitForLine(job, [](const StepLine& l) {
    return l.recovery_point > 0 && l.step >= 40;
  })) << job.Output();
  etcd.Kill(1);
  etcd.Kill(2);
  const StepLine at_loss = LastLine(job);
  const int64_t lost_at = at_loss.step;
  // At least 150 steps without quorum (30 checkpoints due, longer than a node's lease), and
  // until a failed checkpoint was counted (a persist gives up only after etcd's deadlines).
  ASSERT_TRUE(WaitForLine(job, [&](const StepLine& l) {
    return l.step >= lost_at + 150 && l.ckpt_failures > at_loss.ckpt_failures;
  })) << job.Output();
  const int64_t restore_at = LastLine(job).step;  // the last step surely without quorum
  ASSERT_TRUE(etcd.Restart(1, /*wait_healthy=*/false).ok());
  ASSERT_TRUE(etcd.Restart(2).ok()) << etcd.Log(2);
  const int64_t back_at = LastLine(job).step;  // quorum is back by this step
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();

  // Through the outage: stepping on, failures counted, no commit, the recovery point older.
  const StepLine before = LineOf(out, lost_at + 1), during = LineOf(out, restore_at);
  ASSERT_EQ(before.step, lost_at + 1) << out;
  ASSERT_EQ(during.step, restore_at) << out;
  EXPECT_GT(during.ckpt_failures, before.ckpt_failures) << out;
  EXPECT_LE(during.recovery_point, lost_at) << "a checkpoint committed without quorum";
  EXPECT_GT(during.recovery_age_s, before.recovery_age_s) << out;
  const StepWindow pace_before = StepsBetween(ParseStepLines(out), 10, lost_at);
  const StepWindow pace_during = StepsBetween(ParseStepLines(out), lost_at + 1, restore_at);
  std::printf("quorum lost at step %lld, members restarted at %lld, back by %lld: mean step "
              "%.1f ms before, %.1f ms during; largest stall during %.1f ms; ckpt_failures %s\n",
              static_cast<long long>(lost_at), static_cast<long long>(restore_at),
              static_cast<long long>(back_at),
              pace_before.mean_step_ms, pace_during.mean_step_ms, pace_during.max_stall_ms,
              SummaryField(out, "ckpt_failures").c_str());

  // Back: checkpoints commit again; the run ends where the uninterrupted one did.
  const int64_t recovery_point = std::stoll(SummaryField(out, "recovery_point"));
  EXPECT_GT(recovery_point, back_at) << out;
  EXPECT_EQ(SummaryField(out, "params_sha256"), SummaryField(reference.out, "params_sha256"));

  // Nothing incomplete listed: every listed checkpoint's record is committed with both ranks,
  // each with at least W = 2 copies, and it verifies.
  client::ClientOptions o;
  o.etcd = etcd.Endpoints();
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto listed = (*c)->List("q");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_FALSE(listed->empty());
  cluster::EtcdOptions eo;
  eo.endpoints = *cluster::ParseEtcdEndpoints(etcd.Endpoints());
  auto etcd_client = *cluster::EtcdClient::Create(eo);
  cluster::ClusterCatalog catalog(etcd_client.get());
  int64_t resume_from = -1;
  for (const client::CheckpointInfo& i : *listed) {
    auto record = catalog.Get("q", i.step);
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_EQ(record->state, client::CheckpointState::kCommitted) << i.step;
    ASSERT_EQ(record->ranks.size(), 2u) << "step " << i.step << " listed with a rank missing";
    for (const auto& [rank, r] : record->ranks) EXPECT_GE(r.nodes.size(), 2u) << i.step;
    if (i.step > back_at && i.step < kSteps) resume_from = i.step;
  }
  const RunResult verify =
      RunProgram(GRADSNAP_CLI_BIN, {"--etcd", etcd.Endpoints(), "verify", "q", "--all"}, 300);
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;

  // A resume from a checkpoint committed after the outage is exact.
  ASSERT_GT(resume_from, back_at) << out;
  const RunResult resumed = RunTrainer(
      GRADSNAP_TRAIN_BIN,
      absl::StrCat(kModel, " --job q --etcd ", etcd.Endpoints(), " --resume ", resume_from));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  const absl::Status exact = ResumedExactly(reference.out, resumed.out, resume_from);
  EXPECT_TRUE(exact.ok()) << exact;
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
