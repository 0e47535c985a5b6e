// Real-process crash test: a child process (storage_crash_child) writes checkpoints and is
// killed with SIGKILL at random moments. After each kill the engine is reopened here: every
// listed checkpoint must verify and restore byte-identical to what the child wrote, every
// checkpoint seen committed after an earlier kill must still be listed and committed unless the
// child's GC (keep_last 3) was entitled to remove it, and the next child must be able to finish
// whatever was left PENDING.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "storage/crash_workload.h"
#include "storage/rebuild.h"

#ifndef GRADSNAP_CRASH_ITERATIONS
#define GRADSNAP_CRASH_ITERATIONS 50
#endif
#ifndef GRADSNAP_CRASH_SUITE
#define GRADSNAP_CRASH_SUITE CrashTest
#endif

namespace gradsnap {
namespace storage {
namespace {

// The child's retention (crash_workload.h): Gc keeps the newest 3 committed FULLs and the
// DELTAs on them.
constexpr int kCrashKeepLast = 3;

// Whether the child's GC may have removed `c` (a checkpoint seen committed earlier), given what
// is listed now: its FULL (itself, or a DELTA's base) has kCrashKeepLast newer committed FULLs.
bool RetentionMayRemove(const CheckpointInfo& c, const std::vector<CheckpointInfo>& now) {
  const int64_t full = c.kind == CheckpointKind::kFull ? c.step : c.base_step;
  int newer = 0;
  for (const CheckpointInfo& n : now) {
    newer += n.kind == CheckpointKind::kFull && n.state == CheckpointState::kCommitted &&
             n.step > full;
  }
  return newer >= kCrashKeepLast;
}

pid_t Spawn(const std::string& dir, int64_t first, bool uring) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string step = std::to_string(first);
    ::execl(GRADSNAP_CRASH_CHILD, GRADSNAP_CRASH_CHILD, dir.c_str(), step.c_str(),
            uring ? "1" : "0", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

TEST(GRADSNAP_CRASH_SUITE, SigkillAtRandomMoments) {
  TempDir dir;
  std::mt19937_64 rng(::testing::UnitTest::GetInstance()->random_seed() + 12345);
  int64_t next_step = 0;
  int committed_seen = 0;
  int retired = 0;
  std::map<int64_t, CheckpointInfo> committed_before;  // every step seen committed after a kill
  for (int iter = 0; iter < GRADSNAP_CRASH_ITERATIONS; ++iter) {
    pid_t pid = Spawn(dir.path(), next_step, iter % 3 != 2);
    ASSERT_GT(pid, 0);
    // Mostly during steady writing, sometimes right at start-up (recovery, resume).
    int ms = iter % 5 == 0 ? static_cast<int>(rng() % 40) : 40 + static_cast<int>(rng() % 400);
    ::usleep(ms * 1000);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status);

    EngineOptions o;
    o.data_dir = dir.path();
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    auto all = (*e)->ListCheckpoints("crash", true);
    ASSERT_TRUE(all.ok());
    // What was committed before this kill survives it (or was retired by the GC's policy).
    std::map<int64_t, const CheckpointInfo*> listed;
    for (const CheckpointInfo& c : *all) listed[c.step] = &c;
    for (auto it = committed_before.begin(); it != committed_before.end();) {
      auto now = listed.find(it->first);
      if (now == listed.end() && RetentionMayRemove(it->second, *all)) {
        ++retired;
        it = committed_before.erase(it);
        continue;
      }
      ASSERT_NE(now, listed.end())
          << "iteration " << iter << ": committed step " << it->first << " vanished";
      ASSERT_EQ(now->second->state, CheckpointState::kCommitted)
          << "iteration " << iter << ": committed step " << it->first << " is no longer";
      ++it;
    }
    for (const CheckpointInfo& c : *all) {
      next_step = std::max(next_step, c.step + 1);
      if (c.state != CheckpointState::kCommitted) continue;
      ++committed_seen;
      committed_before.emplace(c.step, c);
      SCOPED_TRACE(::testing::Message() << "iteration " << iter << " step " << c.step);
      absl::Status v = (*e)->Verify("crash", c.step);
      ASSERT_TRUE(v.ok()) << v;
      auto m = (*e)->GetManifest("crash", c.step);
      ASSERT_TRUE(m.ok());
      ASSERT_EQ(m->shards.size(), static_cast<size_t>(kCrashRanks));
      for (int r = 0; r < kCrashRanks; ++r) {
        ASSERT_TRUE(m->shards[r].committed);
        ExpectRestores(e->get(), CrashShard(c.step, r));
      }
    }
    // A DELTA never outlives its FULL, and a committed DELTA has a committed FULL.
    for (const CheckpointInfo& c : *all) {
      if (c.kind != CheckpointKind::kDelta) continue;
      auto base = (*e)->GetManifest("crash", c.base_step);
      EXPECT_TRUE(base.ok()) << "DELTA " << c.step;
      if (base.ok() && c.state == CheckpointState::kCommitted) {
        EXPECT_EQ(base->info.state, CheckpointState::kCommitted) << "DELTA " << c.step;
      }
    }
    if (HasFatalFailure()) return;
    if (iter % 10 == 9) {
      // The segments alone (shard footers) bring back every committed checkpoint.
      e->reset();
      auto report = RebuildCatalog(o, /*dry_run=*/true);
      ASSERT_TRUE(report.ok()) << report.status();
      for (const CheckpointInfo& c : *all) {
        if (c.state != CheckpointState::kCommitted) continue;
        const std::string name = "job crash step " + std::to_string(c.step) + " (";
        bool found = false;
        for (const std::string& r : report->rebuilt) found |= r.rfind(name, 0) == 0;
        EXPECT_TRUE(found) << "iteration " << iter << ": a rebuild would lose step " << c.step;
      }
    }
  }
  std::printf(
      "crash test: %d kills, %d committed checkpoints verified, %d retired by GC, reached step "
      "%ld\n",
      GRADSNAP_CRASH_ITERATIONS, committed_seen, retired, static_cast<long>(next_step));
  EXPECT_GT(committed_seen, 0);
  EXPECT_GT(retired, 0);  // the GC ran, so the retention rule above was exercised
  EXPECT_GT(next_step, 5);
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
