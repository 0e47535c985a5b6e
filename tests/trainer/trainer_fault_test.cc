// gradsnap-train under process faults and bad input, with real processes:
//  - the launcher alone SIGKILLed: its ranks die with it, and `--resume latest` right after
//    works and is exact (embedded engine and server);
//  - a zombie rank kept alive on purpose (--test_ignore_parent_death) is fenced off by the next
//    attempt's epoch: its writes are refused as superseded and it exits;
//  - bad input: exit status 2 and one line, never a crash;
//  - a job without a token on a secured server stops at once with one line.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_util.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kTrain = GRADSNAP_TRAIN_BIN;
constexpr int kSteps = 40;
const std::string kJob = absl::StrCat(" --model tiny --batch 4 --seq 16 --steps ", kSteps,
                                      " --nproc 2 --ckpt-mode gockpt --ckpt-every 4"
                                      " --gockpt-window 2 --grad-log --job j");

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A launcher started in the background, its output in a file.
struct Launcher {
  pid_t pid = -1;
  std::string log;
};

Launcher StartLauncher(const std::string& args, const std::string& log) {
  Launcher l;
  l.log = log;
  std::vector<std::string> argv = {kTrain};
  for (absl::string_view a : absl::StrSplit(args, ' ', absl::SkipEmpty())) argv.emplace_back(a);
  l.pid = fork();
  if (l.pid == 0) {
    FILE* f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> a;
    for (std::string& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    execv(kTrain.c_str(), a.data());
    _exit(127);
  }
  return l;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

// The launcher's children (its ranks), from /proc.
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  std::istringstream in(Slurp(absl::StrCat("/proc/", pid, "/task/", pid, "/children")));
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

bool PrintedStep(const std::string& log, int step) {
  return Slurp(log).find(absl::StrCat("\nstep ", step, " ")) != std::string::npos;
}

std::string Reference() {
  static const std::string sha = [] {
    const RunResult r = RunCommand(kTrain + absl::StrCat(" --model tiny --batch 4 --seq 16 "
                                                         "--steps ", kSteps, " --nproc 2"));
    return SummaryField(r.output, "params_sha256");
  }();
  return sha;
}

// Kills the launcher of a running job mid-training, checks its ranks are gone, resumes at once.
void LauncherKillThenResume(const std::string& store, const std::string& dir) {
  Launcher l = StartLauncher(kJob + store + " --test-step-delay-ms 40", dir + "/first.log");
  ASSERT_TRUE(WaitFor(60, [&] { return PrintedStep(l.log, 12); })) << Slurp(l.log);
  const std::vector<pid_t> ranks = Children(l.pid);
  ASSERT_EQ(ranks.size(), 2u);
  kill(l.pid, SIGKILL);
  int st;
  waitpid(l.pid, &st, 0);
  // PR_SET_PDEATHSIG: the kernel kills them with their parent (the bound is generous only for
  // a loaded machine; they normally go within milliseconds).
  EXPECT_TRUE(WaitFor(10, [&] { return !Alive(ranks[0]) && !Alive(ranks[1]); }));
  const RunResult r = RunCommand(kTrain + kJob + store + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed job j from step "), std::string::npos) << r.output;
  EXPECT_EQ(SummaryField(r.output, "params_sha256"), Reference()) << r.output;
}

// An attempt resumed from an older checkpoint persists steps that are already committed (the
// same bytes, training being deterministic): that is idempotent, not an ALREADY_EXISTS wedge.
void RePersistIsIdempotent(const std::string& store) {
  const RunResult first = RunCommand(kTrain + kJob + store);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const RunResult again = RunCommand(kTrain + kJob + store + " --resume 9");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(SummaryField(again.output, "resumed_from"), "9") << again.output;
  EXPECT_EQ(SummaryField(again.output, "ckpt_failures"), "0") << again.output;
  EXPECT_EQ(SummaryField(again.output, "params_sha256"), Reference()) << again.output;
}

TEST(TrainerFaultTest, RePersistOfCommittedStepsIsIdempotentEmbedded) {
  const std::string d = FreshDir("repersist_embedded");
  RePersistIsIdempotent(" --ckpt-dir " + d + "/ckpt");
}

TEST(TrainerFaultTest, LauncherKilledRanksDieResumeEmbedded) {
  const std::string d = FreshDir("lkill_embedded");
  LauncherKillThenResume(" --ckpt-dir " + d + "/ckpt", d);
}

#if defined(GRADSNAP_SERVER_BIN)
TEST(TrainerFaultTest, LauncherKilledRanksDieResumeServer) {
  const std::string d = FreshDir("lkill_server");
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.Start(GRADSNAP_SERVER_BIN, d + "/data", &error)) << error;
  LauncherKillThenResume(" --storage " + server.address(), d);
}

TEST(TrainerFaultTest, RePersistOfCommittedStepsIsIdempotentServer) {
  const std::string d = FreshDir("repersist_server");
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.Start(GRADSNAP_SERVER_BIN, d + "/data", &error)) << error;
  RePersistIsIdempotent(" --storage " + server.address());
}

TEST(TrainerFaultTest, ZombieIsFencedByTheNextAttempt) {
  const std::string d = FreshDir("zombie");
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.Start(GRADSNAP_SERVER_BIN, d + "/data", &error)) << error;
  const std::string store = " --storage " + server.address();
  Launcher l = StartLauncher(kJob + store + " --test-step-delay-ms 60 --test-ignore-parent-death",
                             d + "/zombie.log");
  ASSERT_TRUE(WaitFor(60, [&] { return PrintedStep(l.log, 10); })) << Slurp(l.log);
  const std::vector<pid_t> zombies = Children(l.pid);
  ASSERT_EQ(zombies.size(), 2u);
  kill(l.pid, SIGKILL);
  int st;
  waitpid(l.pid, &st, 0);
  ASSERT_TRUE(Alive(zombies[0]) && Alive(zombies[1]));  // kept alive on purpose
  // The next attempt takes a newer epoch: the zombies' next writes are refused and they exit.
  const RunResult r = RunCommand(kTrain + kJob + store + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(SummaryField(r.output, "params_sha256"), Reference()) << r.output;
  EXPECT_TRUE(WaitFor(60, [&] { return !Alive(zombies[0]) && !Alive(zombies[1]); }));
  EXPECT_NE(Slurp(l.log).find("superseded by attempt"), std::string::npos) << Slurp(l.log);
  // Nothing the zombies did leaves a broken store: resuming once more is still exact.
  const RunResult again = RunCommand(kTrain + kJob + store + " --resume latest");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(SummaryField(again.output, "params_sha256"), Reference());
}

// The server dies for good mid-run: with --ckpt-on-failure continue (the default) the job
// trains to the end with the uninterrupted parameters and counts its failed persists; with stop
// the first failed persist stops it.
TEST(TrainerFaultTest, ServerGoneForGoodContinueOrStop) {
  for (const std::string policy : {"continue", "stop"}) {
    const std::string d = FreshDir("gone_" + policy);
    ServerProcess server;
    std::string error;
    ASSERT_TRUE(server.Start(GRADSNAP_SERVER_BIN, d + "/data", &error)) << error;
    Launcher l = StartLauncher(kJob + " --storage " + server.address() +
                                   " --test-step-delay-ms 30 --ckpt-persist-timeout-ms 200"
                                   " --ckpt-on-failure " + policy,
                               d + "/job.log");
    ASSERT_TRUE(WaitFor(60, [&] { return PrintedStep(l.log, 6); })) << Slurp(l.log);
    server.Kill();
    int st = 0;
    waitpid(l.pid, &st, 0);
    const std::string out = Slurp(l.log);
    if (policy == "continue") {
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
      EXPECT_EQ(SummaryField(out, "params_sha256"), Reference()) << out;
      EXPECT_GT(std::stoi(SummaryField(out, "ckpt_failures")), 0) << out;
    } else {
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << out;
      EXPECT_NE(out.find("UNAVAILABLE: persist "), std::string::npos) << out;
      EXPECT_EQ(out.find("\nsummary "), std::string::npos) << out;
    }
  }
}

TEST(TrainerFaultTest, NoTokenOnSecuredServerStopsWithOneLine) {
  const std::string d = FreshDir("secured");
  { std::ofstream(d + "/secret") << "0123456789abcdef0123456789abcdef"; }
  ServerProcess server;
  std::string error;
  ASSERT_TRUE(server.Start(GRADSNAP_SERVER_BIN, d + "/data", &error, "127.0.0.1:0",
                           {"--auth-secret-file", d + "/secret"}))
      << error;
  const RunResult r = RunCommand(kTrain + kJob + " --max-restarts 3 --storage " +
                                 server.address());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("UNAUTHENTICATED"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart "), std::string::npos) << r.output;
}
#endif

TEST(TrainerFaultTest, BadInputIsOneLineAndExitTwo) {
  const std::string d = FreshDir("badinput");
  const std::vector<std::string> cases = {
      "--nproc 2 --hostname 999.1.1.1",
      "--nproc 2 --hostname 192.0.2.1",  // a valid address, but not this machine's
      "--data /dev/zero",
      "--data " + d,
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
  };
  for (const std::string& c : cases) {
    const RunResult r = RunCommand(kTrain + " --model tiny --steps 2 " + c);
    EXPECT_EQ(r.exit_code, 2) << c << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << c << ": " << r.output;
    EXPECT_EQ(r.output.rfind("gradsnap-train: ", 0), 0u) << c << ": " << r.output;
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
