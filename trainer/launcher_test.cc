// The launcher (trainer/launcher.h) with ranks that fail at once: this binary is its own rank
// (the launcher execs /proc/self/exe with --rank=...), and a rank exits 1 as soon as it starts.
// A stop signal that arrives while the launcher cleans up between attempts (not inside
// waitpid) ends the job with 128 + the signal: no new attempt is started.
#include "trainer/launcher.h"

#include <csignal>
#include <cstdlib>
#include <cstring>

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

}  // namespace
}  // namespace trainer
}  // namespace gradsnap

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rank=", 7) == 0) return 1;  // a rank that fails at once
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
