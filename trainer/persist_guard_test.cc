// PersistGuard: the failure policy of checkpoint persists, on a real store (the embedded engine
// through the client library, one rank). The `work` of a persist is the caller's save; tests
// pass saves that fail the way a store does (UNAVAILABLE, UNAUTHENTICATED, superseded).
#include "trainer/persist_guard.h"

#include <unistd.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "trainer/comm.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace trainer {
namespace {

using client::CheckpointKind;

class PersistGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/gs_persist_guard_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    client::ClientOptions co;
    co.local_dir = dir_;
    auto c = client::Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status();
    store_ = NewDirectShardStore(std::move(*c));
    options_.job = std::string("j");
    options_.persist_timeout_ms = 2000;
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Begins checkpoint `step` (PENDING), as a save that failed half way leaves it.
  void BeginPending(int64_t step) {
    client::CheckpointSpec spec;
    spec.job = "j";
    spec.step = step;
    spec.world_size = 2;
    ASSERT_TRUE(store_->BeginCheckpoint(spec).ok());
  }
  bool Listed(int64_t step, bool include_pending) {
    auto all = store_->client()->List("j", include_pending);
    if (!all.ok()) return false;
    for (const auto& i : *all) {
      if (i.step == step) return true;
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<ShardStore> store_;
  CheckpointerOptions options_;
};

TEST_F(PersistGuardTest, FailedFullCutsItsChainUntilTheNextFull) {
  FakeClock clock;
  PersistGuard quick(store_.get(), options_, 0, -1, &clock);
  int calls = 0;
  auto ok = [&] { ++calls; return absl::OkStatus(); };
  auto down = [&] { ++calls; return absl::UnavailableError("server down"); };
  EXPECT_TRUE(absl::IsUnavailable(quick.Persist(CheckpointKind::kFull, 4, -1, down)));
  calls = 0;
  EXPECT_TRUE(absl::IsCancelled(quick.Persist(CheckpointKind::kDelta, 5, 4, ok)));
  EXPECT_TRUE(absl::IsCancelled(quick.Persist(CheckpointKind::kDelta, 6, 4, ok)));
  EXPECT_EQ(calls, 0);  // skipped without a store call
  clock.AdvanceMillis(kFirstBackoffMs);  // past the back-off
  EXPECT_TRUE(quick.Persist(CheckpointKind::kFull, 8, -1, ok).ok());
  EXPECT_TRUE(quick.Persist(CheckpointKind::kDelta, 9, 8, ok).ok());
  // A failed DELTA cuts the rest of its chain, not the FULL.
  EXPECT_FALSE(quick.Persist(CheckpointKind::kDelta, 10, 8, down).ok());
  EXPECT_TRUE(absl::IsCancelled(quick.Persist(CheckpointKind::kDelta, 11, 8, ok)));
  const CheckpointHealth h = quick.health();
  EXPECT_EQ(h.failures, 2);
  EXPECT_EQ(h.skipped, 3);
  EXPECT_EQ(h.recovery_point, 9);
  EXPECT_TRUE(quick.fatal().ok());
}

// A failed persist is tried once, never retried within itself (the old guard retried a
// transient failure for the whole timeout while the persist queue, and so training, waited);
// the checkpoints after it are skipped untried while the back-off lasts, on rank 0's clock,
// the back-off doubling per failure up to persist_timeout_ms; a success ends it.
TEST_F(PersistGuardTest, FailuresBackOffAcrossCheckpointsNotWithinOne) {
  FakeClock clock;
  PersistGuard g(store_.get(), options_, 0, 3, &clock);  // persist_timeout_ms 2000
  EXPECT_EQ(g.health().recovery_point, 3);
  int calls = 0;
  auto ok = [&] { ++calls; return absl::OkStatus(); };
  auto down = [&] { ++calls; return absl::UnavailableError("restarting"); };
  EXPECT_TRUE(absl::IsUnavailable(g.Persist(CheckpointKind::kFull, 4, -1, down)));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(clock.slept(), 0);  // no wait inside the persist
  // Backing off 100 ms: the next checkpoint is skipped untried, its chain cut.
  calls = 0;
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kFull, 8, -1, ok)));
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kDelta, 9, 8, ok)));
  EXPECT_EQ(calls, 0);
  clock.AdvanceMillis(kFirstBackoffMs);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 12, -1, down).ok());  // tried: fails again
  EXPECT_EQ(calls, 1);
  clock.AdvanceMillis(kFirstBackoffMs);  // 200 ms now: still backing off
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kFull, 16, -1, ok)));
  clock.AdvanceMillis(kFirstBackoffMs);
  EXPECT_TRUE(g.Persist(CheckpointKind::kFull, 20, -1, ok).ok());
  EXPECT_TRUE(g.Persist(CheckpointKind::kDelta, 21, 20, ok).ok());  // no back-off left
  CheckpointHealth h = g.health();
  EXPECT_EQ(h.failures, 2);
  EXPECT_EQ(h.untried, 2);   // FULLs 8 and 16
  EXPECT_EQ(h.skipped, 1);   // DELTA 9 on the skipped FULL 8
  EXPECT_EQ(h.fulls, 1);
  EXPECT_EQ(h.deltas, 1);
  EXPECT_EQ(h.recovery_point, 21);
  // Doubling up to persist_timeout_ms.
  for (int i = 0; i < 6; ++i) {
    clock.AdvanceMillis(options_.persist_timeout_ms);
    EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 24 + 4 * i, -1, down).ok()) << i;
  }
  clock.AdvanceMillis(options_.persist_timeout_ms - 1);
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kFull, 48, -1, ok)));
  clock.AdvanceMillis(1);
  EXPECT_TRUE(g.Persist(CheckpointKind::kFull, 52, -1, ok).ok());
  // Not transient: counted, never fatal.
  clock.AdvanceMillis(options_.persist_timeout_ms);
  auto conflict = [&] { return absl::AlreadyExistsError("conflict"); };
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 56, -1, conflict).ok());
  EXPECT_TRUE(g.fatal().ok());  // reported and skipped, never fatal
}

// A full disk cannot heal in a moment: no retry, and the longest back-off at once. The
// server's own backpressure ("server busy") is not a full disk.
TEST_F(PersistGuardTest, FullDiskFailsFastAndBacksOffTheLongest) {
  EXPECT_TRUE(IsFullDisk(absl::ResourceExhaustedError("disk full: not enough free space")));
  EXPECT_FALSE(IsFullDisk(absl::ResourceExhaustedError("server busy: memory limit")));
  EXPECT_FALSE(IsFullDisk(absl::UnavailableError("down")));
  FakeClock clock;
  PersistGuard g(store_.get(), options_, 0, -1, &clock);
  int calls = 0;
  auto full = [&] { ++calls; return absl::ResourceExhaustedError("not enough free space"); };
  EXPECT_TRUE(absl::IsResourceExhausted(g.Persist(CheckpointKind::kFull, 4, -1, full)));
  EXPECT_EQ(calls, 1);
  clock.AdvanceMillis(options_.persist_timeout_ms - 1);
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kFull, 8, -1, full)));
  clock.AdvanceMillis(1);
  EXPECT_TRUE(absl::IsResourceExhausted(g.Persist(CheckpointKind::kFull, 12, -1, full)));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(g.health().failures, 2);
  EXPECT_EQ(g.health().untried, 1);
}

// A rank that kept no data for a checkpoint (its backlog was full) makes it skipped untried,
// without a store call; its chain is cut until the next FULL.
TEST_F(PersistGuardTest, CheckpointWithoutDataIsSkippedAndCutsItsChain) {
  PersistGuard g(store_.get(), options_, 0, -1);
  int calls = 0;
  auto ok = [&] { ++calls; return absl::OkStatus(); };
  EXPECT_TRUE(g.Persist(CheckpointKind::kFull, 4, -1, ok).ok());
  EXPECT_TRUE(g.Persist(CheckpointKind::kDelta, 5, 4, ok).ok());
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kDelta, 6, 4, ok, false)));
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kDelta, 7, 4, ok)));
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kFull, 8, -1, ok, false)));
  EXPECT_TRUE(absl::IsCancelled(g.Persist(CheckpointKind::kDelta, 9, 8, ok)));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(g.Persist(CheckpointKind::kFull, 12, -1, ok).ok());
  const CheckpointHealth h = g.health();
  EXPECT_EQ(h.failures, 0);
  EXPECT_EQ(h.untried, 2);
  EXPECT_EQ(h.skipped, 2);
  EXPECT_EQ(h.recovery_point, 12);
}

// Two ranks (threads, each with its own store, agreeing over a real Gloo group) take the same
// decision for every checkpoint though only one of them lacks the data, fails, or backs off:
// the persists are collective, and a rank deciding alone would leave the other waiting in an
// agreement it never joins.
TEST_F(PersistGuardTest, TwoRanksTakeTheSameDecisions) {
  const std::string rdzv = dir_ + "/rdzv";
  std::filesystem::create_directories(rdzv);
  std::vector<CheckpointHealth> health(2);
  std::vector<std::vector<int>> outcomes(2);  // per persist: 1 OK, 0 skipped, -1 failed
  std::vector<int> calls(2, 0);
  std::vector<absl::Status> setup(2);
  auto rank_main = [&](int r) {
    absl::StatusOr<std::unique_ptr<Comm>> comm = NewGlooComm(GlooOptions{r, 2, rdzv, "ckpt"});
    client::ClientOptions co;
    co.local_dir = absl::StrCat(dir_, "/rank", r);
    absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(co);
    if (!comm.ok() || !c.ok()) {
      setup[r] = comm.ok() ? c.status() : comm.status();
      return;
    }
    std::unique_ptr<ShardStore> store = NewDirectShardStore(std::move(*c), std::move(*comm));
    FakeClock clock;
    PersistGuard g(store.get(), options_, r, -1, &clock);
    auto ok = [&calls, r] { ++calls[r]; return absl::OkStatus(); };
    auto down_on_1 = [&calls, r] {
      ++calls[r];
      return r == 1 ? absl::UnavailableError("down") : absl::OkStatus();
    };
    auto run = [&](int64_t step, const std::function<absl::Status()>& work, bool have) {
      absl::Status s = g.Persist(CheckpointKind::kFull, step, -1, work, have);
      outcomes[r].push_back(s.ok() ? 1 : absl::IsCancelled(s) ? 0 : -1);
    };
    run(4, ok, /*have=*/r == 0);  // rank 1's backlog was full
    run(8, down_on_1, true);      // fails on rank 1 only
    // Rank 1's clock is past any back-off, rank 0's is not: rank 0's decides.
    if (r == 1) clock.AdvanceSeconds(3600);
    run(12, ok, true);
    if (r == 0) clock.AdvanceMillis(kFirstBackoffMs);
    run(16, ok, true);
    health[r] = g.health();
  };
  std::thread peer(rank_main, 1);
  rank_main(0);
  peer.join();
  ASSERT_TRUE(setup[0].ok() && setup[1].ok()) << setup[0] << " " << setup[1];
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(outcomes[r], (std::vector<int>{0, -1, 0, 1})) << "rank " << r;
    EXPECT_EQ(calls[r], 2) << "rank " << r;  // FULLs 8 and 16 only
    EXPECT_EQ(health[r].failures, 1);
    EXPECT_EQ(health[r].untried, 2);
    EXPECT_EQ(health[r].recovery_point, 16);
  }
}

TEST_F(PersistGuardTest, PermanentErrorsAndStopPolicyAreFatal) {
  {
    PersistGuard g(store_.get(), options_, 0, -1);
    int calls = 0;
    auto denied = [&] { ++calls; return absl::UnauthenticatedError("no token"); };
    EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 4, -1, denied).ok());
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(absl::IsUnauthenticated(g.fatal())) << g.fatal();
  }
  options_.stop_on_failure = true;
  PersistGuard g(store_.get(), options_, 0, -1);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 4, -1,
                         [] { return absl::UnavailableError("down"); }).ok());
  EXPECT_TRUE(absl::IsUnavailable(g.fatal())) << g.fatal();
}

TEST_F(PersistGuardTest, RollBackOfFailedCheckpoints) {
  FakeClock clock;  // moved past each back-off below
  PersistGuard g(store_.get(), options_, 0, -1, &clock);
  // The store answered the failure: rolled back at once.
  BeginPending(4);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 4, -1,
                         [] { return absl::DataLossError("bad"); }).ok());
  EXPECT_FALSE(Listed(4, true));
  // The store did not answer: rolled back after the next persist that succeeds.
  BeginPending(8);
  clock.AdvanceMillis(options_.persist_timeout_ms);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 8, -1,
                         [] { return absl::UnavailableError("down"); }).ok());
  EXPECT_TRUE(Listed(8, true));
  clock.AdvanceMillis(options_.persist_timeout_ms);
  EXPECT_TRUE(g.Persist(CheckpointKind::kFull, 12, -1, [] { return absl::OkStatus(); }).ok());
  EXPECT_FALSE(Listed(8, true));
  // Superseded: a newer attempt owns the job; nothing is rolled back.
  BeginPending(16);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 16, -1,
                         [] { return SupersededError("j", 2, 1); }).ok());
  EXPECT_TRUE(Listed(16, true));
  EXPECT_TRUE(IsSuperseded(g.fatal())) << g.fatal();
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap
