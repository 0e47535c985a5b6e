// The cluster catalog and job epochs against a real etcd started by the test
// (tests/testing/etcd_cluster.h): one record per checkpoint, listed iff COMMITTED, the commit
// one transaction fenced by the job's epoch, DELTAs only on a committed FULL.
#include "cluster/catalog.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/temp_dir.h"

namespace gradsnap {
namespace cluster {
namespace {

using storage::CheckpointKind;
using storage::CheckpointSpec;
using storage::CheckpointState;
using testing::EtcdCluster;
using testing::TempDir;

std::unique_ptr<EtcdClient> Connect(const EtcdCluster& etcd, int timeout_ms = 3000) {
  EtcdOptions o;
  o.endpoints = *ParseEtcdEndpoints(etcd.Endpoints());
  o.rpc_timeout_ms = timeout_ms;
  return *EtcdClient::Create(o);
}

CheckpointSpec Spec(const std::string& job, int64_t step, int32_t world, uint64_t epoch,
                    int64_t base = -1) {
  CheckpointSpec s;
  s.job = job;
  s.step = step;
  s.world_size = world;
  s.epoch = epoch;
  if (base >= 0) {
    s.kind = CheckpointKind::kDelta;
    s.base_step = base;
  }
  return s;
}

RankReplicas Copies(uint64_t bytes, const std::string& digest) {
  return RankReplicas{bytes, digest, {"00000000000000a1", "00000000000000b2"}};
}

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(etcd_.Start(1).ok()) << etcd_.Log(0);
    client_ = Connect(etcd_);
    catalog_ = std::make_unique<ClusterCatalog>(client_.get());
  }
  TempDir dir_{"catalog"};
  EtcdCluster etcd_{dir_.path()};
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<ClusterCatalog> catalog_;
};

TEST_F(CatalogTest, ListedOnlyOnceCommittedAsOneRecord) {
  auto e = catalog_->AcquireEpoch("j");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(catalog_->Begin(Spec("j", 5, 2, *e)).ok());
  ASSERT_TRUE(catalog_->Begin(Spec("j", 5, 2, *e)).ok());  // idempotent
  EXPECT_EQ(catalog_->Begin(Spec("j", 5, 3, *e)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(catalog_->StageRank("j", 5, 0, *e, Copies(100, "d0")).ok());
  absl::Status early = catalog_->Commit("j", 5, *e);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_NE(early.message().find("ranks not durable yet: 1"), absl::string_view::npos) << early;
  EXPECT_TRUE(catalog_->List("j")->empty());
  ASSERT_EQ(catalog_->List("j", /*include_pending=*/true)->size(), 1u);

  ASSERT_TRUE(catalog_->StageRank("j", 5, 1, *e, Copies(200, "d1")).ok());
  ASSERT_TRUE(catalog_->Commit("j", 5, *e).ok());
  ASSERT_TRUE(catalog_->Commit("j", 5, *e).ok());  // our own retry
  auto listed = catalog_->List("j");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  const ClusterCheckpoint& c = (*listed)[0];
  EXPECT_EQ(c.state, CheckpointState::kCommitted);
  EXPECT_EQ(c.epoch, *e);
  EXPECT_EQ(c.world_size, 2);
  ASSERT_EQ(c.ranks.size(), 2u);
  EXPECT_EQ(c.ranks.at(1), Copies(200, "d1"));
  // One key per checkpoint: the staged ranks went with the commit.
  EXPECT_EQ(client_->GetPrefix("/gradsnap/ckpt/j/")->size(), 1u);
  EXPECT_TRUE(client_->GetPrefix("/gradsnap/staged/")->empty());
  // Abort cannot undo a commit; delete can.
  EXPECT_EQ(catalog_->Abort("j", 5, *e).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(catalog_->Delete("j", 5, *e).ok());
  EXPECT_TRUE(catalog_->List("j", true)->empty());
}

TEST_F(CatalogTest, ZombieOfAnOlderAttemptIsFenced) {
  auto old_epoch = catalog_->AcquireEpoch("z");
  ASSERT_TRUE(old_epoch.ok());
  ASSERT_TRUE(catalog_->Begin(Spec("z", 1, 1, *old_epoch)).ok());
  auto new_epoch = catalog_->AcquireEpoch("z");
  ASSERT_TRUE(new_epoch.ok());
  EXPECT_GT(*new_epoch, *old_epoch);
  // The zombie (the old attempt) can neither stage, commit, begin nor abort.
  absl::Status staged = catalog_->StageRank("z", 1, 0, *old_epoch, Copies(1, "x"));
  EXPECT_EQ(staged.code(), absl::StatusCode::kFailedPrecondition) << staged;
  EXPECT_NE(staged.message().find("superseded"), absl::string_view::npos) << staged;
  EXPECT_EQ(catalog_->Begin(Spec("z", 2, 1, *old_epoch)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(catalog_->Abort("z", 1, *old_epoch).code(), absl::StatusCode::kFailedPrecondition);
  // Staged by the new attempt, the old one still cannot commit it.
  ASSERT_TRUE(catalog_->StageRank("z", 1, 0, *new_epoch, Copies(1, "x")).ok());
  EXPECT_EQ(catalog_->Commit("z", 1, *old_epoch).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(catalog_->List("z")->empty());
  ASSERT_TRUE(catalog_->Commit("z", 1, *new_epoch).ok());
  EXPECT_EQ(catalog_->List("z")->size(), 1u);
  // An epoch never acquired is refused too.
  EXPECT_EQ(catalog_->Begin(Spec("z", 3, 1, *new_epoch + 1000)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Two writers (two etcd clients, two catalogs) commit the same checkpoints at once: each time
// exactly one wins, the other gets ALREADY_EXISTS.
TEST_F(CatalogTest, TwoWritersCommittingTheSameCheckpointExactlyOneWins) {
  auto other_client = Connect(etcd_);
  ClusterCatalog other(other_client.get());
  auto e = catalog_->AcquireEpoch("two");
  ASSERT_TRUE(e.ok());
  for (int64_t step = 0; step < 10; ++step) {
    ASSERT_TRUE(catalog_->Begin(Spec("two", step, 1, *e)).ok());
    ASSERT_TRUE(other.Begin(Spec("two", step, 1, *e)).ok());
    ASSERT_TRUE(catalog_->StageRank("two", step, 0, *e, Copies(8, "a")).ok());
    absl::Status mine, theirs;
    std::thread t([&] { theirs = other.Commit("two", step, *e); });
    mine = catalog_->Commit("two", step, *e);
    t.join();
    EXPECT_NE(mine.ok(), theirs.ok()) << step << ": " << mine << " / " << theirs;
    const absl::Status& loser = mine.ok() ? theirs : mine;
    EXPECT_EQ(loser.code(), absl::StatusCode::kAlreadyExists) << loser;
    auto c = catalog_->Get("two", step);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->committed_by, mine.ok() ? catalog_->writer_id() : other.writer_id());
  }
  EXPECT_EQ(catalog_->List("two")->size(), 10u);
}

TEST_F(CatalogTest, DeltaCommitsOnlyWithItsFullCommitted) {
  auto e = catalog_->AcquireEpoch("d");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(catalog_->Begin(Spec("d", 11, 1, *e, /*base=*/10)).code(),
            absl::StatusCode::kFailedPrecondition);  // no FULL 10 at all
  ASSERT_TRUE(catalog_->Begin(Spec("d", 10, 1, *e)).ok());
  ASSERT_TRUE(catalog_->Begin(Spec("d", 11, 1, *e, 10)).ok());
  ASSERT_TRUE(catalog_->StageRank("d", 11, 0, *e, Copies(1, "delta")).ok());
  absl::Status s = catalog_->Commit("d", 11, *e);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(catalog_->List("d")->empty());
  ASSERT_TRUE(catalog_->StageRank("d", 10, 0, *e, Copies(9, "full")).ok());
  ASSERT_TRUE(catalog_->Commit("d", 10, *e).ok());
  ASSERT_TRUE(catalog_->Commit("d", 11, *e).ok());
  auto listed = catalog_->List("d");
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[1].kind, CheckpointKind::kDelta);
  EXPECT_EQ((*listed)[1].base_step, 10);
  EXPECT_EQ(catalog_->Delete("d", 10, *e).code(), absl::StatusCode::kFailedPrecondition);
}

// Begin is one transaction that compares a DELTA's FULL at the revision this catalog last saw
// it at: a FULL rewritten since (repair sets its replicas) is read again and the DELTA begins;
// a FULL deleted since fails the DELTA as before. A rank that finds the checkpoint begun by
// another rank (another catalog) succeeds, one with another spec or a fenced epoch does not.
TEST_F(CatalogTest, DeltaBeginFollowsItsFullAsItIsNow) {
  auto e = catalog_->AcquireEpoch("b");
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(catalog_->Begin(Spec("b", 10, 1, *e)).ok());
  ASSERT_TRUE(catalog_->StageRank("b", 10, 0, *e, Copies(9, "full")).ok());
  ASSERT_TRUE(catalog_->Commit("b", 10, *e).ok());
  ASSERT_TRUE(catalog_->Begin(Spec("b", 11, 1, *e, 10)).ok());  // reads FULL 10, remembers it
  auto full = catalog_->Get("b", 10);
  ASSERT_TRUE(full.ok());
  ASSERT_TRUE(catalog_->SetReplicas(*full, 0, {"00000000000000c3"}, nullptr).ok());
  absl::Status s = catalog_->Begin(Spec("b", 12, 1, *e, 10));
  EXPECT_TRUE(s.ok()) << s;  // the remembered revision is stale: read again
  ClusterCatalog other(client_.get());
  ASSERT_TRUE(other.Begin(Spec("b", 13, 1, *e, 10)).ok());
  s = catalog_->Begin(Spec("b", 13, 1, *e, 10));
  EXPECT_TRUE(s.ok()) << s;  // begun by another rank: the same spec
  EXPECT_EQ(catalog_->Begin(Spec("b", 13, 2, *e, 10)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(client_->Delete(CheckpointRecordKey("b", 10)).ok());
  s = catalog_->Begin(Spec("b", 14, 1, *e, 10));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("needs a FULL checkpoint at step 10"), std::string::npos) << s;
  auto newer = catalog_->AcquireEpoch("b");
  ASSERT_TRUE(newer.ok());
  s = catalog_->Begin(Spec("b", 20, 1, *e));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("superseded by attempt"), std::string::npos) << s;
  auto pending = catalog_->List("b", /*include_pending=*/true);
  ASSERT_TRUE(pending.ok());
  for (const ClusterCheckpoint& c : *pending) EXPECT_NE(c.step, 14) << "a DELTA without its FULL";
}

// A 3-member etcd: one member killed changes nothing; with the quorum lost every write fails
// UNAVAILABLE and nothing incomplete is ever listed; with the quorum back the commit goes
// through.
TEST(CatalogQuorum, MemberLossChangesNothingQuorumLossFailsUnavailable) {
  TempDir dir("catalog-quorum");
  EtcdCluster etcd(dir.path());
  ASSERT_TRUE(etcd.Start(3).ok()) << etcd.Log(0);
  auto client = Connect(etcd, 2000);
  ClusterCatalog catalog(client.get());
  auto e = catalog.AcquireEpoch("q");
  ASSERT_TRUE(e.ok()) << e.status();
  etcd.Kill(0);
  ASSERT_TRUE(catalog.Begin(Spec("q", 1, 2, *e)).ok());
  ASSERT_TRUE(catalog.StageRank("q", 1, 0, *e, Copies(1, "r0")).ok());
  ASSERT_TRUE(catalog.StageRank("q", 1, 1, *e, Copies(1, "r1")).ok());
  ASSERT_TRUE(catalog.Commit("q", 1, *e).ok());
  ASSERT_TRUE(catalog.Begin(Spec("q", 2, 1, *e)).ok());
  ASSERT_TRUE(catalog.StageRank("q", 2, 0, *e, Copies(1, "r0")).ok());
  etcd.Kill(1);  // one of three left: no quorum
  absl::Status commit = catalog.Commit("q", 2, *e);
  EXPECT_EQ(commit.code(), absl::StatusCode::kUnavailable) << commit;
  EXPECT_EQ(catalog.Begin(Spec("q", 3, 1, *e)).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(etcd.Restart(1).ok()) << etcd.Log(1);
  auto listed = catalog.List("q");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);  // step 2 never listed while incomplete
  EXPECT_EQ((*listed)[0].step, 1);
  ASSERT_TRUE(catalog.Commit("q", 2, *e).ok());
  EXPECT_EQ(catalog.List("q")->size(), 2u);
}

}  // namespace
}  // namespace cluster
}  // namespace gradsnap
