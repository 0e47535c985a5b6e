// PersistGuard: the failure policy of checkpoint persists, on a real store (the embedded engine
// through the client library, one rank). The `work` of a persist is the caller's save; tests
// pass saves that fail the way a store does (UNAVAILABLE, UNAUTHENTICATED, superseded).
#include "trainer/persist_guard.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status.h"
#include "gtest/gtest.h"
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
  options_.persist_timeout_ms = 0;  // no retries: the failure counts at once
  PersistGuard quick(store_.get(), options_, 0, -1);
  int calls = 0;
  auto ok = [&] { ++calls; return absl::OkStatus(); };
  auto down = [&] { ++calls; return absl::UnavailableError("server down"); };
  EXPECT_TRUE(absl::IsUnavailable(quick.Persist(CheckpointKind::kFull, 4, -1, down)));
  calls = 0;
  EXPECT_TRUE(absl::IsCancelled(quick.Persist(CheckpointKind::kDelta, 5, 4, ok)));
  EXPECT_TRUE(absl::IsCancelled(quick.Persist(CheckpointKind::kDelta, 6, 4, ok)));
  EXPECT_EQ(calls, 0);  // skipped without a store call
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

TEST_F(PersistGuardTest, TransientFailuresAreRetriedWithinTheTimeout) {
  PersistGuard g(store_.get(), options_, 0, 3);
  EXPECT_EQ(g.health().recovery_point, 3);
  int calls = 0;
  auto flaky = [&] {
    return ++calls < 3 ? absl::UnavailableError("restarting") : absl::OkStatus();
  };
  EXPECT_TRUE(g.Persist(CheckpointKind::kFull, 4, -1, flaky).ok());
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(g.health().failures, 0);
  EXPECT_EQ(g.health().recovery_point, 4);
  // Not transient: no retry.
  calls = 0;
  auto conflict = [&] { ++calls; return absl::AlreadyExistsError("conflict"); };
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 8, -1, conflict).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(g.fatal().ok());  // reported and skipped, never fatal
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
  options_.persist_timeout_ms = 0;
  PersistGuard g(store_.get(), options_, 0, -1);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 4, -1,
                         [] { return absl::UnavailableError("down"); }).ok());
  EXPECT_TRUE(absl::IsUnavailable(g.fatal())) << g.fatal();
}

TEST_F(PersistGuardTest, RollBackOfFailedCheckpoints) {
  options_.persist_timeout_ms = 0;
  PersistGuard g(store_.get(), options_, 0, -1);
  // The store answered the failure: rolled back at once.
  BeginPending(4);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 4, -1,
                         [] { return absl::DataLossError("bad"); }).ok());
  EXPECT_FALSE(Listed(4, true));
  // The store did not answer: rolled back after the next persist that succeeds.
  BeginPending(8);
  EXPECT_FALSE(g.Persist(CheckpointKind::kFull, 8, -1,
                         [] { return absl::UnavailableError("down"); }).ok());
  EXPECT_TRUE(Listed(8, true));
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
