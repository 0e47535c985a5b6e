// Crash consistency with the fault-injecting file system: a crash (or failure) at every write,
// every sync and every metadata commit of the commit protocol. After reopening, every listed
// checkpoint verifies and restores byte-identical, nothing partial is listed, and an
// interrupted checkpoint can be resumed from ShardCommittedSize and committed.
#include <filesystem>

#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/fault_injection_fs.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

enum class Kind { kWrite, kSync, kCommit };

class FaultTest : public ::testing::Test {
 protected:
  EngineOptions Options(const std::string& dir) {
    EngineOptions o;
    o.data_dir = dir;
    o.fs = &fs_;
    o.chunk_bytes = 16 << 10;
    o.adapt_compression = false;
    o.encode_threads = 2;
    return o;
  }
  ShardData Shard(int64_t step, int32_t rank) {
    return MakeShard("fj", step, rank, step * 10 + rank, 9000);
  }
  // Checkpoint 2 (two shards, one written with a Flush in the middle), then Delete(1).
  absl::Status Scenario(Engine* e) {
    absl::Status s = e->BeginCheckpoint({"fj", 2, CheckpointKind::kFull, -1, 2, "m"});
    if (!s.ok()) return s;
    ShardData a = Shard(2, 0), b = Shard(2, 1);
    auto w = e->OpenShardWriter(a.spec);
    if (!w.ok()) return w.status();
    auto stream = a.stream();
    size_t half = stream.size() / 2;
    if (!(s = (*w)->Append(stream.data(), half)).ok()) return s;
    if (!(s = (*w)->Flush()).ok()) return s;
    if (!(s = (*w)->Append(stream.data() + half, stream.size() - half)).ok()) return s;
    if (!(s = (*w)->Finish()).ok()) return s;
    w->reset();
    if (!(s = e->WriteShard(b.spec, b.ptrs())).ok()) return s;
    return e->Delete("fj", 1);
  }
  // Reopens and checks the invariants; completes checkpoint 2 if it was interrupted.
  void CheckAndResume(const std::string& dir) {
    auto e = Engine::Open(Options(dir));
    ASSERT_TRUE(e.ok()) << e.status();
    auto list = (*e)->ListCheckpoints("fj");
    ASSERT_TRUE(list.ok());
    bool have1 = false, have2 = false;
    for (const CheckpointInfo& c : *list) {
      ASSERT_EQ(c.state, CheckpointState::kCommitted);
      absl::Status v = (*e)->Verify("fj", c.step);
      ASSERT_TRUE(v.ok()) << c.step << " " << v;
      for (int r = 0; r < 2; ++r) ExpectRestores(e->get(), Shard(c.step, r));
      have1 |= c.step == 1;
      have2 |= c.step == 2;
    }
    if (!have1) {
      EXPECT_TRUE(have2) << "checkpoint 1 is only deleted after 2 committed";
      EXPECT_FALSE(std::filesystem::exists(dir + "/segments/fj/00000000000000000001"));
    }
    if (!have2) {
      ASSERT_TRUE((*e)->BeginCheckpoint({"fj", 2, CheckpointKind::kFull, -1, 2, "m"}).ok());
      for (int r = 0; r < 2; ++r) {
        ShardData d = Shard(2, r);
        auto w = (*e)->OpenShardWriter(d.spec);
        ASSERT_TRUE(w.ok()) << w.status();
        auto done = (*e)->ShardCommittedSize("fj", 2, r);
        ASSERT_TRUE(done.ok());
        EXPECT_EQ(*done, (*w)->committed_size());
        auto stream = d.stream();
        ASSERT_TRUE((*w)->Append(stream.data() + *done, stream.size() - *done).ok());
        ASSERT_TRUE((*w)->Finish().ok());
      }
      absl::Status v = (*e)->Verify("fj", 2);
      ASSERT_TRUE(v.ok()) << v;
      for (int r = 0; r < 2; ++r) ExpectRestores(e->get(), Shard(2, r));
    }
  }
  // Runs the scenario with a crash at operation n of `kind`; false once n is past the end.
  bool CrashAt(Kind kind, int n) {
    TempDir dir;
    fs_.Reset();
    {
      auto e = Engine::Open(Options(dir.path()));
      EXPECT_TRUE(e.ok()) << e.status();
      ShardData a = Shard(1, 0), b = Shard(1, 1);
      EXPECT_TRUE((*e)->BeginCheckpoint({"fj", 1, CheckpointKind::kFull, -1, 2, ""}).ok());
      EXPECT_TRUE((*e)->WriteShard(a.spec, a.ptrs()).ok());
      EXPECT_TRUE((*e)->WriteShard(b.spec, b.ptrs()).ok());
      FaultInjectionFileSystem::Faults f;
      if (kind == Kind::kWrite) f.fail_write_at = fs_.writes() + n;
      if (kind == Kind::kSync) f.fail_sync_at = fs_.syncs() + n;
      if (kind == Kind::kCommit) f.fail_commit_at = fs_.commits() + n;
      fs_.SetFaults(f);
      absl::Status s = Scenario(e->get());
      if (s.ok()) return false;
      EXPECT_TRUE(fs_.crashed()) << s;
    }
    fs_.Reset();
    CheckAndResume(dir.path());
    return true;
  }

  FaultInjectionFileSystem fs_;
};

TEST_F(FaultTest, CrashAtEveryWrite) {
  int n = 1;
  while (CrashAt(Kind::kWrite, n) && !HasFatalFailure()) ++n;
  EXPECT_GT(n, 5);
}

TEST_F(FaultTest, CrashAtEverySync) {
  int n = 1;
  while (CrashAt(Kind::kSync, n) && !HasFatalFailure()) ++n;
  EXPECT_GT(n, 3);
}

TEST_F(FaultTest, CrashAtEveryMetadataCommit) {
  int n = 1;
  while (CrashAt(Kind::kCommit, n) && !HasFatalFailure()) ++n;
  EXPECT_GT(n, 4);
}

TEST_F(FaultTest, OutOfSpaceKeepsEarlierCheckpointsAndRecovers) {
  TempDir dir;
  auto e = Engine::Open(Options(dir.path()));
  ASSERT_TRUE(e.ok());
  ShardData a = Shard(1, 0);
  ASSERT_TRUE((*e)->BeginCheckpoint({"fj", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ASSERT_TRUE((*e)->WriteShard(a.spec, a.ptrs()).ok());
  FaultInjectionFileSystem::Faults f;
  f.fail_write_at = fs_.writes() + 3;
  f.enospc = true;
  f.crash_on_fault = false;
  fs_.SetFaults(f);
  ShardData b = Shard(2, 0);
  ASSERT_TRUE((*e)->BeginCheckpoint({"fj", 2, CheckpointKind::kFull, -1, 1, ""}).ok());
  absl::Status s = (*e)->WriteShard(b.spec, b.ptrs());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ((*e)->ListCheckpoints("fj")->size(), 1u);
  EXPECT_TRUE((*e)->Verify("fj", 1).ok());
  ExpectRestores(e->get(), a);
  // Space is back: the same shard resumes and commits.
  fs_.SetFaults({});
  ASSERT_TRUE((*e)->WriteShard(b.spec, b.ptrs()).ok());
  EXPECT_TRUE((*e)->Verify("fj", 2).ok());
  ExpectRestores(e->get(), b);
}

// A commit that fails (a catalog disk below its reserve) and is retried with the same writer
// names every segment the shard's chunks lie in, including those it rolled past before the
// failure: after reopening, the shard verifies and restores exact.
TEST_F(FaultTest, RetriedCommitNamesEverySegment) {
  TempDir dir;
  ShardData a = MakeShard("fj", 1, 0, 11, 700000);  // 2.8 MB: rolls over 1 MiB segments
  {
    EngineOptions o = Options(dir.path());
    o.segment_bytes = 1 << 20;
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->BeginCheckpoint({"fj", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
    auto w = (*e)->OpenShardWriter(a.spec);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const auto& t : a.bytes) ASSERT_TRUE((*w)->Append(t.data(), t.size()).ok());
    FaultInjectionFileSystem::Faults f;
    f.fail_commit_at = fs_.commits() + 1;
    f.crash_on_fault = false;
    fs_.SetFaults(f);
    EXPECT_FALSE((*w)->Finish().ok());
    fs_.SetFaults({});
    ASSERT_TRUE((*w)->Finish().ok());
    w->reset();
    EXPECT_TRUE((*e)->Verify("fj", 1).ok());
  }
  fs_.Reset();
  auto e = Engine::Open(Options(dir.path()));
  ASSERT_TRUE(e.ok()) << e.status();
  absl::Status v = (*e)->Verify("fj", 1);
  EXPECT_TRUE(v.ok()) << v;
  ExpectRestores(e->get(), a);
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
