// gradsnap-train under process faults and bad input, with real processes:
//  - the launcher alone SIGKILLed: its ranks die with it, and `--resume latest` right after
//    works and is exact (embedded engine and server);
//  - a zombie rank kept alive on purpose (--test_ignore_parent_death) is fenced off by the next
//    attempt's epoch: its writes are refused as superseded and it exits;
//  - bad input: exit status 2 and one line, never a crash;
//  - a job without a token on a secured server stops at once with one line;
//  - a frozen rank ends the attempt after --collective-timeout-s and the job restarts (Gloo on
//    the CPU; on the simulated device, the deadline that bounds NCCL on CUDA);
//  - `gradsnap rm` of the newest DELTA under a running job cuts its chain (nothing unrestorable
//    is listed) and the job trains on.
#include <netdb.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kTrain = GRADSNAP_TRAIN_BIN;
const std::string kCli = GRADSNAP_CLI_BIN;
constexpr int kSteps = 40;
const std::string kJob = absl::StrCat(" --model tiny --batch 4 --seq 16 --steps ", kSteps,
                                      " --nproc 2 --ckpt-mode gockpt --ckpt-every 4"
                                      " --gockpt-window 2 --grad-log --job j");

// Starts gradsnap-train `args` (shell words) in the background, its output in `log`.
void StartLauncher(ChildProcess* launcher, const std::string& args, const std::string& log) {
  std::vector<std::string> argv = {kTrain};
  for (absl::string_view a : absl::StrSplit(args, ' ', absl::SkipEmpty())) argv.emplace_back(a);
  const absl::Status st = launcher->Start(argv, log);
  ASSERT_TRUE(st.ok()) << st;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The launcher's children (its ranks), from /proc.
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  std::istringstream in(ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/task/", pid, "/children")));
  for (pid_t c; in >> c;) out.push_back(c);
  return out;
}

// Waits (bounded by `seconds`, polling) until `done` holds.
template <typename F>
bool WaitFor(double seconds, F done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool PrintedStep(const ChildProcess& launcher, int step) {
  return launcher.Output().find(absl::StrCat("\nstep ", step, " ")) != std::string::npos;
}

// Runs the job `args` in the background until it printed step `step`, then SIGKILLs its
// launcher alone. Returns the launcher's ranks as they were just before.
std::vector<pid_t> KillLauncherAtStep(ChildProcess* launcher, const std::string& args,
                                      const std::string& log, int step) {
  StartLauncher(launcher, args, log);
  const bool printed = WaitFor(60, [&] { return PrintedStep(*launcher, step); });
  EXPECT_TRUE(printed) << "no step " << step << ": " << launcher->Output();
  const std::vector<pid_t> ranks = printed ? Children(launcher->pid()) : std::vector<pid_t>{};
  launcher->Kill();
  return ranks;
}

std::string Reference() {
  static const std::string sha = [] {
    const RunResult r = RunTrainer(kTrain, absl::StrCat(" --model tiny --batch 4 --seq 16 "
                                                        "--steps ",
                                                        kSteps, " --nproc 2"));
    return SummaryField(r.out, "params_sha256");
  }();
  return sha;
}

// Kills the launcher of a running job mid-training, checks its ranks are gone, resumes at once.
void LauncherKillThenResume(const std::string& store, const std::string& dir) {
  ChildProcess launcher;
  const std::vector<pid_t> ranks = KillLauncherAtStep(
      &launcher, kJob + store + " --test-step-delay-ms 40", dir + "/first.log", 12);
  ASSERT_EQ(ranks.size(), 2u);
  // PR_SET_PDEATHSIG: the kernel kills them with their parent (the bound is generous only for
  // a loaded machine; they normally go within milliseconds).
  EXPECT_TRUE(WaitFor(10, [&] { return !Alive(ranks[0]) && !Alive(ranks[1]); }));
  const RunResult r = RunTrainer(kTrain, kJob + store + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed job j from step "), std::string::npos) << r.out;
  EXPECT_EQ(SummaryField(r.out, "params_sha256"), Reference()) << r.out;
}

// An attempt resumed from an older checkpoint persists steps that are already committed (the
// same bytes, training being deterministic): that is idempotent, not an ALREADY_EXISTS wedge.
void RePersistIsIdempotent(const std::string& store) {
  const RunResult first = RunTrainer(kTrain, kJob + store);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  const RunResult again = RunTrainer(kTrain, kJob + store + " --resume 9");
  ASSERT_TRUE(IsOk(ResumedFrom(again, 9)));
  EXPECT_EQ(SummaryField(again.out, "ckpt_failures"), "0") << again.out;
  EXPECT_EQ(SummaryField(again.out, "params_sha256"), Reference()) << again.out;
}

// Each test gets a directory and, when it starts it, a gradsnap-server on dir_/data.
class TrainerFaultTest : public ::testing::Test {
 protected:
  // Starts the server with `extra` flags; the job flags that point at it (" --storage ADDR").
  std::string StartServer(const std::vector<std::string>& extra = {}) {
    const absl::Status st = server_.StartOn(dir_ + "/data", "127.0.0.1:0", extra);
    EXPECT_TRUE(st.ok()) << st;
    return " --storage " + server_.address();
  }

  // Starts the server and the job on it, its ranks slowed by `delay_ms` a step and kept alive
  // when their parent dies (--test-ignore-parent-death), and SIGKILLs the launcher at `step`:
  // the ranks left running (`zombies`) are zombies of that attempt. The job's store flags.
  std::string LeaveZombies(ChildProcess* launcher, int delay_ms, int step,
                           std::vector<pid_t>* zombies) {
    const std::string store = StartServer();
    *zombies = KillLauncherAtStep(
        launcher,
        absl::StrCat(kJob, store, " --test-step-delay-ms ", delay_ms,
                     " --test-ignore-parent-death"),
        dir_ + "/zombie.log", step);
    return store;
  }

  void ExpectFreezeMeetsTheDeadline(const std::string& job_args, const std::string& freeze_args,
                                    const std::string& line);

  const TempDir tmp_{"trainer_fault"};
  const std::string dir_ = tmp_.path();
  ServerProcess server_{GRADSNAP_SERVER_BIN};
  std::string store_;      // ExpectFreezeMeetsTheDeadline's server, started once
  std::string reference_;  // and its uninterrupted run's params_sha256, run once
  int jobs_ = 0;           // ExpectFreezeMeetsTheDeadline's jobs so far
};

TEST_F(TrainerFaultTest, RePersistOfCommittedStepsIsIdempotentEmbedded) {
  RePersistIsIdempotent(" --ckpt-dir " + dir_ + "/ckpt");
}

TEST_F(TrainerFaultTest, LauncherKilledRanksDieResumeEmbedded) {
  LauncherKillThenResume(" --ckpt-dir " + dir_ + "/ckpt", dir_);
}

TEST_F(TrainerFaultTest, LauncherKilledRanksDieResumeServer) {
  const std::string store = StartServer();
  ASSERT_TRUE(server_.running());
  LauncherKillThenResume(store, dir_);
}

TEST_F(TrainerFaultTest, RePersistOfCommittedStepsIsIdempotentServer) {
  const std::string store = StartServer();
  ASSERT_TRUE(server_.running());
  RePersistIsIdempotent(store);
}

// The next attempt (resumed at once) fences the zombies: it ends exact, and they are refused
// ("superseded") and exit.
void ExpectNextAttemptFencesZombies(const std::string& store, const ChildProcess& launcher,
                                    const std::vector<pid_t>& zombies) {
  const RunResult r = RunTrainer(kTrain, kJob + store + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(SummaryField(r.out, "params_sha256"), Reference()) << r.out;
  EXPECT_TRUE(WaitFor(60, [&] { return !Alive(zombies[0]) && !Alive(zombies[1]); }));
  EXPECT_NE(launcher.Output().find("superseded by attempt"), std::string::npos)
      << launcher.Output();
}

TEST_F(TrainerFaultTest, ZombieIsFencedByTheNextAttempt) {
  ChildProcess launcher;
  std::vector<pid_t> zombies;
  const std::string store = LeaveZombies(&launcher, 60, 10, &zombies);
  ASSERT_EQ(zombies.size(), 2u);
  ASSERT_TRUE(Alive(zombies[0]) && Alive(zombies[1]));  // kept alive on purpose
  // The next attempt takes a newer epoch: the zombies' next writes are refused and they exit.
  ExpectNextAttemptFencesZombies(store, launcher, zombies);
  // Nothing the zombies did leaves a broken store: resuming once more is still exact.
  const RunResult again = RunTrainer(kTrain, kJob + store + " --resume latest");
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_EQ(SummaryField(again.out, "params_sha256"), Reference());
}

// The storage node comes back with its data gone (a new disk) while a zombie of the previous
// attempt still runs: the node's epoch counter starts anew, yet the next attempt still gets an
// epoch above the zombie's (epochs are at least the wall clock in ms), so the zombie is refused
// and exits instead of writing beside the new attempt.
TEST_F(TrainerFaultTest, ZombieIsFencedAfterTheServerLostItsData) {
  ChildProcess launcher;
  std::vector<pid_t> zombies;
  const std::string store = LeaveZombies(&launcher, 150, 6, &zombies);
  ASSERT_EQ(zombies.size(), 2u);
  server_.Kill();
  std::filesystem::rename(dir_ + "/data", dir_ + "/data.lost");
  ASSERT_TRUE(server_.Restart().ok());
  ASSERT_TRUE(Alive(zombies[0]) && Alive(zombies[1]));
  ExpectNextAttemptFencesZombies(store, launcher, zombies);
}

// A launch (or a restart) while the server is down waits the outage out before its checks and
// its epoch, as before them, and trains once the server is back: it is not refused.
TEST_F(TrainerFaultTest, LaunchDuringAnOutageWaitsForTheServer) {
  const std::string store = StartServer();
  ASSERT_TRUE(server_.running());
  const RunResult first = RunTrainer(kTrain, kJob + store + " --steps 12");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  server_.Kill();
  ChildProcess launcher;
  StartLauncher(&launcher, kJob + store + " --resume latest", dir_ + "/outage.log");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(server_.Restart().ok());
  EXPECT_EQ(launcher.Wait(), 0) << launcher.Output();
  EXPECT_NE(launcher.Output().find("resumed job j from step 12"), std::string::npos)
      << launcher.Output();
  EXPECT_EQ(SummaryField(launcher.Output(), "ckpt_failures"), "0") << launcher.Output();
}

// Taking a writer epoch fences out the running attempt, so only a launch that will write takes
// one: a second launch that is refused (a fresh run of a job that has checkpoints; a resume with
// another model) or one that only reads (checkpointing off) leaves the running job training.
TEST_F(TrainerFaultTest, RefusedOrReadOnlyLaunchLeavesTheRunningJobAlone) {
  const std::string store = StartServer();
  ASSERT_TRUE(server_.running());
  ChildProcess running;
  StartLauncher(&running, kJob + store + " --test-step-delay-ms 60", dir_ + "/running.log");
  ASSERT_TRUE(WaitFor(60, [&] { return PrintedStep(running, 10); })) << running.Output();
  const RunResult fresh = RunTrainer(kTrain, kJob + store);
  EXPECT_EQ(fresh.exit_code, 2) << fresh.out;
  EXPECT_NE(fresh.out.find("already has checkpoints"), std::string::npos) << fresh.out;
  const RunResult other_model =
      RunTrainer(kTrain, absl::StrCat(kJob, store, " --resume latest --model small"));
  EXPECT_EQ(other_model.exit_code, 2) << other_model.out;
  EXPECT_NE(other_model.out.find("does not match this run"), std::string::npos)
      << other_model.out;
  const RunResult read_only = RunTrainer(
      kTrain, " --model tiny --batch 4 --seq 16 --steps 2 --nproc 1 --job j --resume latest" +
                  store);
  EXPECT_EQ(read_only.exit_code, 0) << read_only.out;
  EXPECT_NE(read_only.out.find("resumed job j from step"), std::string::npos) << read_only.out;
  EXPECT_EQ(running.Wait(), 0) << running.Output();
  EXPECT_EQ(running.Output().find("superseded"), std::string::npos) << running.Output();
  EXPECT_EQ(SummaryField(running.Output(), "params_sha256"), Reference()) << running.Output();
  EXPECT_EQ(SummaryField(running.Output(), "ckpt_failures"), "0") << running.Output();
}

// Two ranks saving into one embedded directory on a disk that fills up: rank 0 begins each
// checkpoint for both, and when the begin is refused (the catalog's free-space reserve) rank 1
// is already sending its shard. Both must agree on the failure and train on; the old rank 0
// returned at once and waited for rank 1's agreement while rank 1 waited to send: stuck for good.
TEST_F(TrainerFaultTest, FullDiskUnderTwoEmbeddedRanksDegradesNotHangs) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const std::string small = dir_ + "/small";
  ASSERT_EQ(::mkdir(small.c_str(), 0755), 0);
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=30m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here";
  }
  const RunResult r = RunCommand(
      kTrain + absl::StrCat(" --model tiny --batch 4 --seq 16 --steps 60 --nproc 2 "
                            "--ckpt-mode gockpt --ckpt-every 5 --gockpt-window 2 --grad-log "
                            "--ckpt-persist-timeout-ms 200 --job j --ckpt-dir ",
                            small, "/d 2>&1"),
      /*timeout_s=*/120);
  ::umount2(small.c_str(), MNT_DETACH);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("checkpointing degraded (training continues)"), std::string::npos) << r.out;
  EXPECT_NE(SummaryField(r.out, "ckpt_failures"), "0") << r.out;
  EXPECT_EQ(SummaryField(r.out, "params_sha256"),
            SummaryField(RunTrainer(kTrain, " --model tiny --batch 4 --seq 16 --steps 60 "
                                            "--nproc 2").out,
                         "params_sha256"));
}

// The server dies for good mid-run: with --ckpt-on-failure continue (the default) the job
// trains to the end with the uninterrupted parameters and counts its failed persists; with stop
// the first failed persist stops it.
TEST_F(TrainerFaultTest, ServerGoneForGoodContinueOrStop) {
  for (const std::string policy : {"continue", "stop"}) {
    const std::string d = tmp_.Sub(policy);
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.StartOn(d + "/data").ok()) << server.Log();
    ChildProcess job;
    StartLauncher(&job,
                  kJob + " --storage " + server.address() +
                      " --test-step-delay-ms 30 --ckpt-persist-timeout-ms 200"
                      " --ckpt-on-failure " +
                      policy,
                  d + "/job.log");
    ASSERT_TRUE(WaitFor(60, [&] { return PrintedStep(job, 6); })) << job.Output();
    server.Kill();
    const int exit_code = job.Wait();
    const std::string out = job.Output();
    if (policy == "continue") {
      EXPECT_EQ(exit_code, 0) << out;
      EXPECT_EQ(SummaryField(out, "params_sha256"), Reference()) << out;
      EXPECT_GT(std::stoi(SummaryField(out, "ckpt_failures")), 0) << out;
    } else {
      EXPECT_EQ(exit_code, 1) << out;
      EXPECT_NE(out.find("UNAVAILABLE: persist "), std::string::npos) << out;
      EXPECT_EQ(out.find("\nsummary "), std::string::npos) << out;
    }
  }
}

// The committed checkpoints of job j as (step, kind) from `gradsnap --json ls j`, oldest first.
std::vector<std::pair<int64_t, std::string>> Committed(const std::string& cli) {
  const RunResult r = RunCommand(cli + " --json ls j");
  std::vector<std::pair<int64_t, std::string>> out;
  static const std::regex re(R"re("step":(\d+),"kind":"(full|delta)"[^}]*"state":"committed")re");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), re), end; it != end; ++it) {
    out.emplace_back(std::stoll((*it)[1]), (*it)[2]);
  }
  return out;
}

// `gradsnap rm` of the newest DELTA while its job writes on: the store refuses the DELTA after
// the gap ("the chain is cut"), the job trains to the end with the uninterrupted parameters,
// and every checkpoint listed afterwards restores. Before the store checked the chain, the
// later DELTAs of the cut chain were committed and listed, and none of them restored.
TEST_F(TrainerFaultTest, RmOfTheNewestDeltaUnderARunningJobCutsItsChain) {
  const std::string store = StartServer();
  const std::string cli = kCli + " --server " + server_.address();
  ChildProcess job;
  StartLauncher(&job, kJob + store + " --test-step-delay-ms 60", dir_ + "/job.log");
  int64_t removed = -1;
  for (int attempt = 0; attempt < 200 && removed < 0; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto listed = Committed(cli);
    // A DELTA of the FULL at 8 or later (the chain on 4 may still be the only one).
    if (listed.empty() || listed.back().second != "delta" || listed.back().first < 10) continue;
    // Refused when the trainer committed the next DELTA meanwhile: try the new newest.
    if (RunCommand(absl::StrCat(cli, " rm j ", listed.back().first)).exit_code == 0) {
      removed = listed.back().first;
    }
  }
  ASSERT_GE(removed, 0) << "no DELTA removed: " << job.Output();
  ASSERT_EQ(job.Wait(), 0) << job.Output();
  const std::string out = job.Output();
  EXPECT_EQ(SummaryField(out, "params_sha256"), Reference()) << out;
  const auto listed = Committed(cli);
  ASSERT_FALSE(listed.empty());
  // Unless the job ended there or began a FULL next, its next DELTA on that chain was refused.
  if (removed < kSteps &&
      std::find(listed.begin(), listed.end(), std::make_pair(removed + 1, std::string("full"))) ==
          listed.end()) {
    EXPECT_NE(out.find("the chain is cut"), std::string::npos) << out;
  }
  for (const auto& [step, kind] : listed) {
    EXPECT_NE(step, removed);
    const RunResult r = RunCommand(absl::StrCat(cli, " restore j ", step, " --out ", dir_,
                                                "/restored", step));
    EXPECT_EQ(r.exit_code, 0) << kind << " " << step << ": " << r.out;
  }
  const RunResult resumed = RunTrainer(kTrain, kJob + store + " --resume latest");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out;
}

// A rank that hangs (SIGSTOP: frozen, its sockets open, so no peer sees it gone) is found by
// the others' collective timeout: with --collective-timeout-s 3 the attempt fails in seconds
// (a rank waiting on the persist agreement instead: within half a minute),
// the launcher stops the frozen rank (SIGKILL after its grace) and restarts the job from its
// checkpoint, and it ends exactly like an uninterrupted run. The wait is bounded below the
// default timeout (300 s), so on a trainer without the flag this test fails, not hangs.
TEST_F(TrainerFaultTest, HungRankEndsTheAttemptAfterTheCollectiveTimeout) {
  // Through a server: the ranks' persist agreement waits 3 s + 0.2 s of persist retries + 20 s of
  // store deadlines at most (embedded, rank 0 writes for all and that group keeps 300 s).
  const std::string store = StartServer();
  ChildProcess job;
  StartLauncher(&job,
                kJob + store +
                    " --test-step-delay-ms 40 --max-restarts 1 --ckpt-persist-timeout-ms 200"
                    " --collective-timeout-s 3",
                dir_ + "/job.log");
  ASSERT_TRUE(WaitFor(60, [&] { return PrintedStep(job, 10); })) << job.Output();
  pid_t rank1 = -1;
  for (pid_t p : Children(job.pid())) {
    std::string cmdline = ReadFileOrEmpty(absl::StrCat("/proc/", p, "/cmdline"));
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(" --rank=1 ") != std::string::npos) rank1 = p;
  }
  ASSERT_GT(rank1, 0) << job.Output();
  ASSERT_EQ(kill(rank1, SIGSTOP), 0);
  const bool ended = WaitFor(120, [&] { return !job.running(); });
  if (!ended) {
    kill(rank1, SIGKILL);
    job.Kill();
  }
  ASSERT_TRUE(ended) << "the job did not end 120 s after a rank froze: " << job.Output();
  const std::string out = job.Output();
  EXPECT_EQ(job.Wait(), 0) << out;
  EXPECT_NE(out.find("Timed out waiting 3000ms"), std::string::npos) << out;
  EXPECT_NE(SummaryField(out, "resumed_from"), "") << out;
  EXPECT_EQ(SummaryField(out, "params_sha256"), Reference()) << out;
  EXPECT_FALSE(Alive(rank1));
}

// The freeze drill on the simulated device (--test-freeze-at-step: rank 1 SIGSTOPs itself mid-
// step once its device ran the work queued so far, its sockets open), whose collectives have no
// limit of their own, as NCCL's have none: rank 0's next wait for its device polls with
// --collective-timeout-s (3 s here), aborts the device's group and fails with `line`; the
// launcher stops the frozen rank and restarts the job, which resumes from its checkpoint and
// ends exactly like an uninterrupted run. Every wait is bounded: a trainer that waits for ever
// fails the test after 120 s (ctest's TIMEOUT is larger).
void TrainerFaultTest::ExpectFreezeMeetsTheDeadline(const std::string& job_args,
                                                    const std::string& freeze_args,
                                                    const std::string& line) {
  if (reference_.empty()) {  // every freeze job ends like this uninterrupted run
    const RunResult uninterrupted = RunTrainer(
        kTrain, " --model tiny --batch 4 --seq 16 --steps 40 --nproc 2 --device sim");
    ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.out;
    reference_ = SummaryField(uninterrupted.out, "params_sha256");
    ASSERT_FALSE(reference_.empty()) << uninterrupted.out;
  }
  if (store_.empty()) store_ = StartServer();
  ChildProcess job;
  StartLauncher(&job,
                job_args + store_ +
                    " --device sim --max-restarts 1 --ckpt-persist-timeout-ms 200"
                    " --collective-timeout-s 3 --fail-rank 1" + freeze_args,
                absl::StrCat(dir_, "/job", ++jobs_, ".log"));
  const std::string froze = "freeze drill: rank 1 stops itself at step ";
  ASSERT_TRUE(WaitFor(60, [&] { return job.Output().find(froze) != std::string::npos; }))
      << job.Output();
  const std::vector<pid_t> ranks = Children(job.pid());
  const bool ended = WaitFor(120, [&] { return !job.running(); });
  if (!ended) {
    for (pid_t p : ranks) kill(p, SIGKILL);
    job.Kill();
  }
  ASSERT_TRUE(ended) << "the job did not end 120 s after a rank froze: " << job.Output();
  const std::string out = job.Output();
  EXPECT_EQ(job.Wait(), 0) << out;
  EXPECT_NE(out.find(line), std::string::npos) << out;
  EXPECT_EQ(CountOf(out, "collective deadline"), 1) << out;
  EXPECT_NE(out.find("restart 1 of 1: rank 0 exited with status 1"), std::string::npos) << out;
  EXPECT_NE(SummaryField(out, "resumed_from"), "") << out;
  EXPECT_EQ(SummaryField(out, "params_sha256"), reference_) << out;
  for (pid_t p : ranks) EXPECT_FALSE(Alive(p)) << p;
}

// Frozen before its share of step 10's reduction: rank 0 waits for the reduced gradients.
TEST_F(TrainerFaultTest, FrozenRankOnTheSimDeviceMeetsTheCollectiveDeadline) {
  ExpectFreezeMeetsTheDeadline(
      kJob, " --test-freeze-at-step 10",
      "gradsnap-train: rank 0: UNAVAILABLE: collective deadline: the gradient reduce-scatter on "
      "sim:0 did not complete in 3 s (--collective-timeout-s): a peer rank is frozen or gone; "
      "the device's collective group aborted\n");
}

// Frozen after its update of step 8, a FULL step, before its share of the parameter all-gather:
// rank 0's next wait for its device is the checkpoint hook's, for the FULL's copy, queued after
// that all-gather (async and sync copy the state at the end of the step). On a trainer whose
// hook waits for the copy without the deadline, the job hangs.
TEST_F(TrainerFaultTest, FrozenRankBeforeTheAllGatherMeetsTheDeadlineInTheCheckpointHook) {
  for (const char* mode : {"async", "sync"}) {
    SCOPED_TRACE(mode);
    ExpectFreezeMeetsTheDeadline(
        absl::StrCat(" --model tiny --batch 4 --seq 16 --steps 40 --nproc 2 --ckpt-mode ", mode,
                     " --ckpt-every 4 --job ", mode),
        " --test-freeze-at-step 8 --test-freeze-before allgather",
        "gradsnap-train: rank 0: UNAVAILABLE: collective deadline: the snapshot copies on sim:0 "
        "(queued after the device's collectives) did not complete in 3 s "
        "(--collective-timeout-s): a peer rank is frozen or gone; the device's collective group "
        "aborted\n");
    if (HasFatalFailure()) return;
  }
}

// A rank that fails with an error a restart can fix exits at once, without tearing down
// (train_main.cc), but writes its --trace first: here the frozen peer's partner meets the
// collective deadline with no restart left, and its trace is complete JSON with the steps it ran.
TEST_F(TrainerFaultTest, FailedAttemptStillWritesItsTrace) {
  const std::string store = StartServer();
  const std::string trace = dir_ + "/failed.json";
  ChildProcess job;
  StartLauncher(&job,
                kJob + store +
                    " --device sim --max-restarts 0 --collective-timeout-s 2"
                    " --test-freeze-at-step 6 --fail-rank 1 --trace " + trace,
                dir_ + "/job.log");
  const std::vector<pid_t> ranks = [&] {
    WaitFor(60, [&] { return job.Output().find("stops itself at step 6") != std::string::npos; });
    return Children(job.pid());
  }();
  const bool ended = WaitFor(120, [&] { return !job.running(); });
  if (!ended) {
    for (pid_t p : ranks) kill(p, SIGKILL);
    job.Kill();
  }
  ASSERT_TRUE(ended) << job.Output();
  const std::string out = job.Output();
  EXPECT_NE(job.Wait(), 0) << out;
  EXPECT_NE(out.find("gradsnap-train: rank 0: UNAVAILABLE: collective deadline"),
            std::string::npos) << out;
  const std::string json = ReadFileOrEmpty(trace);
  EXPECT_TRUE(absl::StartsWith(json, "{\"displayTimeUnit\"")) << json.substr(0, 200);
  EXPECT_TRUE(absl::EndsWith(json, "}}\n")) << json.substr(json.size() > 200 ? json.size() - 200 : 0);
  EXPECT_NE(json.find("ckpt after_backward"), std::string::npos);
  EXPECT_NE(json.find("forward+backward 5"), std::string::npos);
}

// A launch after one whose launcher was SIGKILLed (so nothing rolled its PENDING checkpoints
// back) rolls them back once it holds the job's epoch. Here the killed attempt had begun FULL 9;
// the resumed run's DELTA 9 on FULL 8 met it: ALREADY_EXISTS, a failed persist and a chain cut
// until FULL 12 (ckpt_failures=1 on the old trainer).
TEST_F(TrainerFaultTest, ResumeRollsBackAKilledAttemptsPendingCheckpoint) {
  const std::string ckpt = dir_ + "/ckpt";
  const std::string job =
      " --model tiny --batch 4 --seq 16 --nproc 2 --ckpt-mode gockpt --ckpt-every 4"
      " --gockpt-window 1 --grad-log --job j --ckpt-dir " + ckpt;
  const RunResult first = RunTrainer(kTrain, job + " --steps 8");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  {
    client::ClientOptions o;
    o.local_dir = ckpt;
    auto c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    const client::CheckpointSpec killed{"j", 9, client::CheckpointKind::kFull, -1, 2, ""};
    ASSERT_TRUE((*c)->BeginCheckpoint(killed).ok());
  }
  const RunResult resumed = RunTrainer(kTrain, job + " --steps 12 --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("rolled back 1 pending checkpoint(s) of an earlier attempt"),
            std::string::npos)
      << resumed.out;
  EXPECT_EQ(SummaryField(resumed.out, "ckpt_failures"), "0") << resumed.out;
  EXPECT_EQ(SummaryField(resumed.out, "recovery_point"), "12") << resumed.out;
}

TEST_F(TrainerFaultTest, NoTokenOnSecuredServerStopsWithOneLine) {
  { std::ofstream(dir_ + "/secret") << "0123456789abcdef0123456789abcdef"; }
  const std::string store = StartServer({"--auth-secret-file", dir_ + "/secret"});
  ASSERT_TRUE(server_.running());
  const RunResult r = RunTrainer(kTrain, kJob + " --max-restarts 3" + store);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("UNAUTHENTICATED"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("restart "), std::string::npos) << r.out;
}

TEST_F(TrainerFaultTest, BadInputIsOneLineAndExitTwo) {
  std::vector<std::string> cases = {
      "--nproc 2 --hostname 999.1.1.1",
      "--nproc 2 --hostname 192.0.2.1",  // a valid address, but not this machine's
      "--data /dev/zero",
      "--data " + dir_,
      "--rank 0 --world-size 0",
      "--rank 3 --world-size 2",
      "--no-such-flag 1",
      "--steps abc",
      "--steps",
      "--max-restarts -1",
      "--nproc -3",
      "--nnodes 0",
      "--ckpt-on-failure maybe",
      "--job a/b --ckpt-mode sync --ckpt-every 2",
      "--storage nohostport --ckpt-mode sync --ckpt-every 2",
      "--grad-log=maybe",
      "--collective-timeout-s 0",
      "--test-freeze-at-step -2",
      "--test-freeze-before update",
      "--ckpt-thread-nice 20",
      "--ckpt-thread-nice -1",
      "--ckpt-mode none --grad-log --ckpt-dir " + dir_ + "/ck",
      "--nproc 2 --test-freeze-at-step 3 --fail-rank 2",
      "--collective-timeout-s 99999999999999999",
      "--lr nan",
      "--lr 1e30",
      "--lr 0",
      "--grad-clip -1",
      "--grad-clip inf",
      "--weight-decay -0.5",
      "--warmup -5",
      "--min-lr-ratio -1",
      "--min-lr-ratio 2",
      "--fail-at-step -7",
      "--storage ,,, --ckpt-mode sync --ckpt-every 2",
      "--storage 127.0.0.1:1,,127.0.0.1:2 --ckpt-mode sync --ckpt-every 2",
  };
  // A host the name service says does not exist: a typo, not an outage to wait out (where the
  // name service answers here at all).
  struct addrinfo* found = nullptr;
  if (::getaddrinfo("no-such-host.invalid", nullptr, nullptr, &found) == EAI_NONAME) {
    cases.push_back("--storage no-such-host.invalid:47101 --ckpt-mode sync --ckpt-every 2");
  }
  if (found != nullptr) ::freeaddrinfo(found);
  for (const std::string& c : cases) {
    const RunResult r = RunTrainer(kTrain, " --model tiny --steps 2 " + c);
    EXPECT_EQ(r.exit_code, 2) << c << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c << ": " << r.out;
    EXPECT_EQ(r.out.rfind("gradsnap-train: ", 0), 0u) << c << ": " << r.out;
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
