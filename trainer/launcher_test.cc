// The launcher (trainer/launcher.h) with ranks that fail at once: this binary is its own rank
// (the launcher execs /proc/self/exe with --rank=...), and a rank exits 1 as soon as it starts.
// A stop signal that arrives while the launcher cleans up between attempts (not inside
// waitpid) ends the job with 128 + the signal: no new attempt is started.
#include "trainer/launcher.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

}  // namespace
}  // namespace trainer
}  // namespace gradsnap

int main(int argc, char** argv) {
  const char* mode = std::getenv("GRADSNAP_LAUNCHER_TEST");
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
