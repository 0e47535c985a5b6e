// The launcher (trainer/launcher.h) with ranks that fail at once: this binary is its own rank
// (the launcher execs /proc/self/exe with --rank=...), and a rank exits 1 as soon as it starts.
// A stop signal that arrives while the launcher cleans up between attempts (not inside
// waitpid) ends the job with 128 + the signal: no new attempt is started.
#include "trainer/launcher.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace gradsnap {
namespace trainer {
namespace {

TEST(Launcher, StopDuringCleanUpStartsNoNewAttempt) {
  LaunchOptions o;
  o.nproc = 1;
  o.max_restarts = 3;
  int cleanups = 0;
  o.before_restart = [&] {
    ++cleanups;
    std::raise(SIGTERM);  // arrives outside waitpid: the launcher is cleaning up
  };
  EXPECT_EQ(Launch(o), 128 + SIGTERM);
  EXPECT_EQ(cleanups, 1) << "a new attempt was started after the stop signal";
}

TEST(Launcher, FailingRanksUseTheRestartsThenGiveUp) {
  LaunchOptions o;
  o.nproc = 2;
  o.max_restarts = 2;
  int cleanups = 0;
  o.before_restart = [&] { ++cleanups; };
  EXPECT_NE(Launch(o), 0);
  EXPECT_EQ(cleanups, 2);
}

// Rank 0 fails at once (a transient error, say); rank 1 has found a permanent one and exits
// with kExitNoRestart a moment later, while the launcher stops the ranks. Restarting cannot
// help: no new attempt.
TEST(Launcher, PermanentErrorOfALaterRankStopsTheRestarts) {
  ::setenv("GRADSNAP_LAUNCHER_TEST", "late-no-restart", 1);
  // Rank 1 says when it ignores SIGTERM; rank 0 fails only then (else, on a loaded machine,
  // the launcher's stop could reach rank 1 before its handler and kill it).
  const std::string ready = ::testing::TempDir() + "/launcher-ready-" + std::to_string(getpid());
  std::remove(ready.c_str());
  ::setenv("GRADSNAP_LAUNCHER_READY", ready.c_str(), 1);
  LaunchOptions o;
  o.nproc = 2;
  o.max_restarts = 3;
  int cleanups = 0;
  o.before_restart = [&] { ++cleanups; };
  EXPECT_EQ(Launch(o), kExitNoRestart);
  EXPECT_EQ(cleanups, 0);
  ::unsetenv("GRADSNAP_LAUNCHER_TEST");
  ::unsetenv("GRADSNAP_LAUNCHER_READY");
  std::remove(ready.c_str());
}

// The ranks run with OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's idle threads sleep at once) unless
// the user's environment sets it, in which case they get the user's value. Each rank exits 0
// only when it sees the value GRADSNAP_LAUNCHER_EXPECT names.
TEST(Launcher, RanksGetOpenBlasThreadTimeoutUnlessTheUserSetsIt) {
  ::setenv("GRADSNAP_LAUNCHER_TEST", "env", 1);
  const char* before = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  const std::string saved = before != nullptr ? before : "";
  LaunchOptions o;
  o.nproc = 2;
  ::unsetenv("OPENBLAS_THREAD_TIMEOUT");
  ::setenv("GRADSNAP_LAUNCHER_EXPECT", kOpenBlasThreadTimeout, 1);
  EXPECT_EQ(Launch(o), 0);
  ::setenv("OPENBLAS_THREAD_TIMEOUT", "12", 1);
  ::setenv("GRADSNAP_LAUNCHER_EXPECT", "12", 1);
  EXPECT_EQ(Launch(o), 0);
  ::setenv("GRADSNAP_LAUNCHER_EXPECT", "4", 1);  // planted: the ranks see 12, so they fail
  EXPECT_NE(Launch(o), 0);
  if (before != nullptr) {
    ::setenv("OPENBLAS_THREAD_TIMEOUT", saved.c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_THREAD_TIMEOUT");
  }
  ::unsetenv("GRADSNAP_LAUNCHER_EXPECT");
  ::unsetenv("GRADSNAP_LAUNCHER_TEST");
}

// A launcher of node `node_rank` of two (one rank each) in a child process of the test (a
// launcher reaps any child, so no launcher may be another's parent). The child exits with the
// number of restarts it made when the job finished (status 0), else 10 + the status (at most 9).
pid_t LaunchNodeInChild(const std::string& rdzv, int node_rank, int max_restarts) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  LaunchOptions o;
  o.nproc = 1;
  o.nnodes = 2;
  o.node_rank = node_rank;
  o.rdzv = rdzv;
  o.max_restarts = max_restarts;
  int restarts = 0;
  o.before_restart = [&] { ++restarts; };
  const int code = Launch(o);
  std::_Exit(code == 0 ? restarts : 10 + std::min(code, 9));
}

// Two nodes of one rank each, two launchers (LaunchNodeInChild). Node 1's rank fails at once;
// node 0's rank would run 60 s more in attempt 0 and then exit 0, ending the job with no
// restart. Node 0's launcher must learn of node 1's failure from the rendezvous directory, stop
// its rank and restart with node 1 (attempt 1: both ranks exit 0).
TEST(Launcher, AnotherNodesFailureRestartsThisNodeAtOnce) {
  ::setenv("GRADSNAP_LAUNCHER_TEST", "two-nodes", 1);
  const std::string rdzv = ::testing::TempDir() + "/launcher-rdzv-" + std::to_string(getpid());
  std::filesystem::remove_all(rdzv);
  const pid_t node0 = LaunchNodeInChild(rdzv, 0, /*max_restarts=*/1);
  const pid_t node1 = LaunchNodeInChild(rdzv, 1, /*max_restarts=*/1);
  ASSERT_GT(node0, 0);
  ASSERT_GT(node1, 0);
  int status0 = 0, status1 = 0;
  ASSERT_EQ(waitpid(node0, &status0, 0), node0);
  ASSERT_EQ(waitpid(node1, &status1, 0), node1);
  ASSERT_TRUE(WIFEXITED(status0) && WIFEXITED(status1));
  EXPECT_EQ(WEXITSTATUS(status0), 1) << "node 0: restarts, or 10 + its exit status";
  EXPECT_EQ(WEXITSTATUS(status1), 1) << "node 1: restarts, or 10 + its exit status";
  std::string said;
  if (FILE* f = std::fopen((rdzv + "/attempt-0/failed").c_str(), "r")) {
    char line[256] = {};
    if (std::fgets(line, sizeof(line), f) != nullptr) said = line;
    std::fclose(f);
  }
  EXPECT_EQ(said.rfind("1 ", 0), 0u) << said;  // node 1 said it, with the failed rank
  EXPECT_NE(said.find("rank 1 exited with status 1"), std::string::npos) << said;
  std::filesystem::remove_all(rdzv);
  ::unsetenv("GRADSNAP_LAUNCHER_TEST");
}


// The launcher of node 1 is SIGKILLed with its rank (the machine died) and started again, as
// the machine's supervisor would. The restarted launcher must join the running job, not start
// it over in attempt 0:
// - before node 0 noticed anything (its rank would run on in attempt 0 for 30 s): the new
//   launcher finds its own mark in attempt 0, says that attempt failed, and starts attempt 1;
//   node 0's launcher reads that and restarts into attempt 1 too;
// - after node 0 noticed (its rank fails as a collective would when its peer dies) and moved
//   on to attempt 1 alone: the new launcher joins attempt 1.
// In attempts after the first the two ranks rendezvous (each waits up to 20 s for the other's
// file in the attempt's directory) and exit 0.
void KillAndRestartALauncher(bool peer_notices) {
  ::setenv("GRADSNAP_LAUNCHER_TEST", "rejoin", 1);
  if (peer_notices) ::setenv("GRADSNAP_LAUNCHER_WATCH", "1", 1);
  const std::string rdzv =
      ::testing::TempDir() + "/launcher-rejoin-" + std::to_string(getpid());
  std::filesystem::remove_all(rdzv);
  const pid_t node0 = LaunchNodeInChild(rdzv, 0, /*max_restarts=*/2);
  pid_t node1 = LaunchNodeInChild(rdzv, 1, /*max_restarts=*/2);
  ASSERT_GT(node0, 0);
  ASSERT_GT(node1, 0);
  // Node 1's rank is up in attempt 0 (it wrote its pid): kill it and its launcher.
  const std::string up1 = rdzv + "/attempt-0/up-1";
  for (int i = 0; i < 2000 && ::access(up1.c_str(), F_OK) != 0; ++i) ::usleep(5000);
  ASSERT_EQ(::access(up1.c_str(), F_OK), 0) << "node 1's rank never started";
  ::usleep(20 * 1000);  // its pid is written (the file appears first)
  int rank1 = 0;
  if (FILE* f = std::fopen(up1.c_str(), "r")) {
    if (std::fscanf(f, "%d", &rank1) != 1) rank1 = 0;
    std::fclose(f);
  }
  ASSERT_GT(rank1, 0);
  ::kill(node1, SIGKILL);
  ::kill(rank1, SIGKILL);
  int status1 = 0;
  ASSERT_EQ(waitpid(node1, &status1, 0), node1);
  if (peer_notices) {  // node 0 has moved on to attempt 1 without node 1
    const std::string mark = rdzv + "/attempt-1/node-0";
    for (int i = 0; i < 2000 && ::access(mark.c_str(), F_OK) != 0; ++i) ::usleep(5000);
    ASSERT_EQ(::access(mark.c_str(), F_OK), 0) << "node 0 did not restart by itself";
  }
  node1 = LaunchNodeInChild(rdzv, 1, 2);  // the supervisor starts node 1's launcher again
  ASSERT_GT(node1, 0);
  int status0 = 0;
  ASSERT_EQ(waitpid(node0, &status0, 0), node0);
  ASSERT_EQ(waitpid(node1, &status1, 0), node1);
  ASSERT_TRUE(WIFEXITED(status0) && WIFEXITED(status1));
  EXPECT_EQ(WEXITSTATUS(status0), 1) << "node 0: restarts, or 10 + its exit status";
  EXPECT_EQ(WEXITSTATUS(status1), 0) << "node 1 joined: no restart of its own, or 10 + status";
  EXPECT_EQ(::access((rdzv + "/attempt-1/node-1").c_str(), F_OK), 0) << "node 1 not in attempt 1";
  EXPECT_NE(::access((rdzv + "/attempt-2").c_str(), F_OK), 0) << "an attempt was wasted";
  std::string said;
  if (FILE* f = std::fopen((rdzv + "/attempt-0/failed").c_str(), "r")) {
    char line[256] = {};
    if (std::fgets(line, sizeof(line), f) != nullptr) said = line;
    std::fclose(f);
  }
  if (!peer_notices) {
    EXPECT_NE(said.find("1 "), std::string::npos) << said;
    EXPECT_NE(said.find("the launcher of node 1 restarted"), std::string::npos) << said;
  } else {
    EXPECT_EQ(said.rfind("0 ", 0), 0u) << said;  // node 0 found its rank failed
  }
  std::filesystem::remove_all(rdzv);
  ::unsetenv("GRADSNAP_LAUNCHER_TEST");
  ::unsetenv("GRADSNAP_LAUNCHER_WATCH");
}

TEST(Launcher, RestartedLauncherEndsTheAttemptItsRanksDiedIn) { KillAndRestartALauncher(false); }

TEST(Launcher, RestartedLauncherJoinsTheAttemptTheOthersStarted) {
  KillAndRestartALauncher(true);
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap

int main(int argc, char** argv) {
  const char* mode = std::getenv("GRADSNAP_LAUNCHER_TEST");
  if (mode != nullptr && std::strcmp(mode, "env") == 0) {
    for (int i = 1; i < argc; ++i) {
      if (std::strncmp(argv[i], "--rank=", 7) != 0) continue;
      const char* want = std::getenv("GRADSNAP_LAUNCHER_EXPECT");
      const char* got = std::getenv("OPENBLAS_THREAD_TIMEOUT");
      return want != nullptr && got != nullptr && std::strcmp(want, got) == 0 ? 0 : 1;
    }
  }
  if (mode != nullptr && std::strcmp(mode, "two-nodes") == 0) {
    bool first_attempt = false, rank0 = false;
    for (int i = 1; i < argc; ++i) {
      first_attempt = first_attempt || std::strcmp(argv[i], "--attempt=0") == 0;
      rank0 = rank0 || std::strcmp(argv[i], "--rank=0") == 0;
    }
    if (!first_attempt) return 0;
    if (!rank0) return 1;  // node 1's rank fails at once
    ::sleep(60);           // node 0's rank: stopped by its launcher, or ends attempt 0 cleanly
    return 0;
  }
  if (mode != nullptr && std::strcmp(mode, "rejoin") == 0) {
    std::string dir;
    int rank = -1;
    bool first_attempt = false;
    for (int i = 1; i < argc; ++i) {
      if (std::strncmp(argv[i], "--rdzv_dir=", 11) == 0) dir = argv[i] + 11;
      if (std::strncmp(argv[i], "--rank=", 7) == 0) rank = std::atoi(argv[i] + 7);
      first_attempt = first_attempt || std::strcmp(argv[i], "--attempt=0") == 0;
    }
    if (dir.empty() || rank < 0) return 1;
    if (FILE* f = std::fopen((dir + "/up-" + std::to_string(rank)).c_str(), "w")) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
    }
    const std::string peer = dir + "/up-" + std::to_string(1 - rank);
    if (first_attempt) {
      if (rank == 1 || std::getenv("GRADSNAP_LAUNCHER_WATCH") == nullptr) {
        ::sleep(30);  // killed, or stopped by the launcher (else the test fails)
        return 0;
      }
      // Rank 0 watches its peer as a collective would: it fails once the peer is gone.
      for (int i = 0; i < 6000; ++i) {
        int pid = 0;
        if (FILE* f = std::fopen(peer.c_str(), "r")) {
          if (std::fscanf(f, "%d", &pid) != 1) pid = 0;
          std::fclose(f);
        }
        if (pid > 0 && ::kill(pid, 0) != 0) return 1;
        ::usleep(5000);
      }
      return 0;
    }
    for (int i = 0; i < 4000 && ::access(peer.c_str(), F_OK) != 0; ++i) ::usleep(5000);
    return ::access(peer.c_str(), F_OK) == 0 ? 0 : 1;
  }
  const bool late = mode != nullptr && std::strcmp(mode, "late-no-restart") == 0;
  const char* ready = std::getenv("GRADSNAP_LAUNCHER_READY");
  for (int i = 1; i < argc; ++i) {
    if (late && ready != nullptr && std::strcmp(argv[i], "--rank=1") == 0) {
      std::signal(SIGTERM, SIG_IGN);  // finishes its own exit while being stopped
      if (FILE* f = std::fopen(ready, "w")) std::fclose(f);
      ::usleep(200 * 1000);
      return gradsnap::trainer::kExitNoRestart;
    }
    if (late && ready != nullptr && std::strcmp(argv[i], "--rank=0") == 0) {
      for (int k = 0; k < 2000 && ::access(ready, F_OK) != 0; ++k) ::usleep(5 * 1000);
      return 1;  // fails once rank 1 is ready (10 s at most)
    }
    if (std::strncmp(argv[i], "--rank=", 7) == 0) return 1;  // a rank that fails at once
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
