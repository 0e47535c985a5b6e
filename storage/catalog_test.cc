// The catalog never costs data: refusal when it is missing/empty/unreadable (directory left
// exactly as found), rebuild from shard footers, quarantine instead of unlink, DELTAs that
// wait for their base, repair of old stores, read-only opens, writer-init failures.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "storage/damage_util.h"
#include "storage/engine.h"
#include "common/crc32c.h"
#include "storage/record_coding.h"
#include "storage/footer.h"
#include "storage/fault_injection_fs.h"
#include "storage/metadata.h"
#include "storage/quarantine.h"
#include "storage/rebuild.h"
#include "storage/storage_stats.h"
#include "storage/test_util.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace storage {
namespace {

namespace fs = std::filesystem;

// Every path below a directory -> its bytes: "exactly as found".
using testing::DirContents;

void ExpectSameTree(const std::map<std::string, std::string>& a,
                    const std::map<std::string, std::string>& b) {
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) {
      ADD_FAILURE() << k << " disappeared";
    } else if (it->second != v) {
      ADD_FAILURE() << k << " changed";
    }
  }
  for (const auto& [k, v] : b) {
    if (a.count(k) == 0) ADD_FAILURE() << k << " appeared";
  }
}

using testing::CountFiles;

std::unique_ptr<Engine> OpenOk(const EngineOptions& o) {
  auto e = Engine::Open(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

std::unique_ptr<Engine> OpenOk(const std::string& dir, bool read_only = false,
                               Clock* clock = nullptr) {
  EngineOptions o;
  o.data_dir = dir;
  o.read_only = read_only;
  o.clock = clock;
  return OpenOk(o);
}

// The store in `dir` on file system `fs` (a fault-injecting one).
std::unique_ptr<Engine> OpenOn(FileSystem* fs, const std::string& dir) {
  EngineOptions o;
  o.data_dir = dir;
  o.fs = fs;
  return OpenOk(o);
}

absl::Status OpenStatus(const std::string& dir) {
  EngineOptions o;
  o.data_dir = dir;
  return Engine::Open(o).status();
}

CheckpointSpec Spec(const std::string& job, int64_t step, int32_t world, int64_t base = -1) {
  const CheckpointKind kind = base < 0 ? CheckpointKind::kFull : CheckpointKind::kDelta;
  return {job, step, kind, base, world, absl::StrCat("m", step)};
}

// A store with: FULL 10 (2 ranks), DELTA 11 on 10 (2 ranks), job b FULL 5, and a
// PENDING FULL 30 whose rank 0 is committed and rank 1 half written (flushed).
struct Store {
  std::vector<ShardData> committed;
};

Store WriteStore(const std::string& dir) {
  Store st;
  auto e = OpenOk(dir);
  auto write = [&](const std::string& job, int64_t step, int32_t world, int64_t base) {
    EXPECT_TRUE(e->BeginCheckpoint(Spec(job, step, world, base)).ok());
    for (int32_t r = 0; r < world; ++r) {
      ShardData d = MakeShard(job, step, r, step * 10 + r, 300000);
      EXPECT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
      st.committed.push_back(d);
    }
  };
  write("a", 10, 2, -1);
  write("a", 11, 2, 10);
  write("b", 5, 1, -1);
  EXPECT_TRUE(e->BeginCheckpoint(Spec("a", 30, 2)).ok());
  ShardData d0 = MakeShard("a", 30, 0, 300, 300000);
  EXPECT_TRUE(e->WriteShard(d0.spec, d0.ptrs()).ok());
  ShardData d1 = MakeShard("a", 30, 1, 301, 300000);
  auto w = e->OpenShardWriter(d1.spec);
  EXPECT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Append(d1.bytes[0].data(), 500000).ok());
  EXPECT_TRUE((*w)->Flush().ok());
  return st;
}

void ExpectStoreRestores(const std::string& dir, const Store& st) {
  auto e = OpenOk(dir);
  ASSERT_NE(e, nullptr);
  auto a = e->ListCheckpoints("a", true);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 2u);  // 10 and 20; the half-written 30 is not brought back
  EXPECT_EQ((*a)[0].step, 10);
  EXPECT_EQ((*a)[1].step, 11);
  EXPECT_EQ((*a)[1].kind, CheckpointKind::kDelta);
  EXPECT_EQ((*a)[1].base_step, 10);
  EXPECT_EQ((*a)[1].metadata, "m11");
  for (const ShardData& d : st.committed) ExpectRestores(e.get(), d);
  EXPECT_TRUE(e->Verify("a", 10).ok());
  EXPECT_TRUE(e->Verify("b", 5).ok());
  // Sizes as written: the sum of the checkpoint's shards, each counted once.
  for (const char* job : {"a", "b"}) {
    auto listed = e->ListCheckpoints(job);
    ASSERT_TRUE(listed.ok()) << listed.status();
    for (const CheckpointInfo& c : *listed) {
      uint64_t raw = 0;
      for (const ShardData& d : st.committed) {
        if (d.spec.job == job && d.spec.step == c.step) raw += d.stream().size();
      }
      EXPECT_EQ(c.raw_bytes, raw) << job << " step " << c.step;
    }
  }
}

// Whether engine `e` holds no checkpoint of `job` at all, PENDING ones included.
template <typename EnginePtr>
::testing::AssertionResult HoldsNothingOf(const EnginePtr& e, const std::string& job) {
  auto listed = e->ListCheckpoints(job, /*include_pending=*/true);
  if (!listed.ok()) return ::testing::AssertionFailure() << listed.status();
  if (!listed->empty()) return ::testing::AssertionFailure() << listed->size() << " listed";
  return ::testing::AssertionSuccess();
}

void ExpectRefusal(const std::string& dir) {
  auto before = DirContents(dir);
  absl::Status s = OpenStatus(dir);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("--rebuild-catalog"), std::string::npos) << s;
  // A supervisor restarting it again and again changes nothing either.
  EXPECT_TRUE(absl::IsFailedPrecondition(OpenStatus(dir)));
  ExpectSameTree(before, DirContents(dir));
}

// RebuildCatalog of the store in `dir` (not a dry run).
absl::StatusOr<RebuildReport> Rebuild(const std::string& dir) {
  EngineOptions o;
  o.data_dir = dir;
  return RebuildCatalog(o, /*dry_run=*/false);
}

// The same after removing its catalog, as if lost.
absl::StatusOr<RebuildReport> RebuildWithoutCatalog(const std::string& dir) {
  fs::remove_all(dir + "/meta");
  return Rebuild(dir);
}

void RebuildAndCheck(const std::string& dir, const Store& st) {
  auto report = Rebuild(dir);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rebuilt.size(), 3u);
  ASSERT_EQ(report->skipped.size(), 1u);
  EXPECT_NE(report->skipped[0].find("job a step 30"), std::string::npos) << report->skipped[0];
  ExpectStoreRestores(dir, st);
}

// The real file system, but removing a checkpoint's directory fails: a delete stopped after its
// catalog commit, before its files went (as by a kill there).
class NoRemoveAllFs : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& options) override {
    return base_->Open(path, options);
  }
  absl::Status CreateDirs(const std::string& path) override { return base_->CreateDirs(path); }
  absl::Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  absl::Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  absl::Status RemoveAll(const std::string& path) override {
    if (path.find("/segments/") == std::string::npos) return base_->RemoveAll(path);
    return absl::UnavailableError("stopped before the files were removed");
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }

 private:
  FileSystem* const base_ = FileSystem::Default();
};

// An rm stopped between its catalog commit and the removal of its files is not undone by a
// later rebuild from the footers: the checkpoint's directory carries the delete's marker.
TEST(CatalogTest, InterruptedDeleteIsNotBroughtBackByARebuild) {
  TempDir dir;
  NoRemoveAllFs no_remove;
  {
    auto e = OpenOn(&no_remove, dir.path());
    ASSERT_NE(e, nullptr);
    for (int64_t step : {1, 2}) {
      ASSERT_TRUE(e->BeginCheckpoint(Spec("del", step, 1, -1)).ok());
      ShardData d = MakeShard("del", step, 0, step, 1000);
      ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
    }
    EXPECT_FALSE(e->Delete("del", 2).ok());  // the catalog is committed, the files stay
    EXPECT_EQ(e->ListCheckpoints("del")->size(), 1u);
  }
  ASSERT_TRUE(fs::exists(dir.path() + "/segments/del/00000000000000000002"));
  auto report = RebuildWithoutCatalog(dir.path());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->rebuilt.size(), 1u);
  EXPECT_NE(report->rebuilt[0].find("step 1"), std::string::npos) << report->rebuilt[0];
  ASSERT_EQ(report->skipped.size(), 1u);
  EXPECT_NE(report->skipped[0].find("step 2: deleted"), std::string::npos) << report->skipped[0];
}

// Two processes opening one new directory at once (two servers started together): they take
// turns creating the store, so at least one opens it (the other finds it made and then in use),
// and the directory is a sound store afterwards; before, both could fail and leave a catalog
// without segments/ that no later open could use.
TEST(CatalogTest, TwoProcessesCreatingOneStoreTakeTurns) {
  for (int round = 0; round < 6; ++round) {
    TempDir dir;
    const std::string data = dir.path() + "/data";
    pid_t kids[2];
    for (pid_t& kid : kids) {
      kid = ::fork();
      ASSERT_GE(kid, 0);
      if (kid == 0) {
        EngineOptions o;
        o.data_dir = data;
        auto e = Engine::Open(o);
        if (e.ok()) ::usleep(200 * 1000);  // still open while the other one tries
        ::_exit(e.ok() ? 0 : absl::IsFailedPrecondition(e.status()) ? 1 : 2);
      }
    }
    int opened = 0;
    for (pid_t kid : kids) {
      int status = 0;
      ASSERT_EQ(::waitpid(kid, &status, 0), kid);
      ASSERT_TRUE(WIFEXITED(status));
      EXPECT_NE(WEXITSTATUS(status), 2) << "an open failed other than with 'in use'";
      opened += WEXITSTATUS(status) == 0;
    }
    EXPECT_GE(opened, 1) << "round " << round;
    EXPECT_TRUE(fs::is_directory(data + "/segments")) << "round " << round;
    auto e = OpenOk(data);
    ASSERT_NE(e, nullptr) << "round " << round;
    EXPECT_TRUE(e->BeginCheckpoint(Spec("race", 1, 1, -1)).ok());
  }
}

// The data directory removed (or swapped for another) under an open engine, as by `rm -rf` next
// to a running server: every mutation is refused, naming the directory, instead of being
// acknowledged as durable into deleted files. Reads of what is open go on.
TEST(CatalogTest, DataDirRemovedUnderAnOpenEngineRefusesWrites) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  auto e = OpenOk(data);
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->BeginCheckpoint(Spec("rm", 1, 1, -1)).ok());
  fs::rename(data, dir.path() + "/gone");
  fs::create_directories(data);  // another, empty directory of the same name
  for (const absl::Status& s :
       {e->BeginCheckpoint(Spec("rm", 2, 1, -1)), e->AcquireEpoch("rm").status(),
        e->Delete("rm", 1)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("was removed or replaced while open"), std::string::npos) << s;
  }
  fs::remove_all(data);
  EXPECT_EQ(e->BeginCheckpoint(Spec("rm", 3, 1, -1)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A rebuilt checkpoint's sizes are its shards' sum, whichever shard committed last (each footer
// carries the checkpoint as it stood when that shard was written).
TEST(CatalogTest, RebuiltSizesCountEachShardOnce) {
  TempDir dir;
  uint64_t raw = 0;
  {
    auto e = OpenOk(dir.path());
    ASSERT_TRUE(e->BeginCheckpoint(Spec("sz", 1, 2, -1)).ok());
    for (int32_t r : {1, 0}) {  // rank 0, whose footer the rebuild starts from, last
      ShardData d = MakeShard("sz", 1, r, 7 + r, 200000);
      ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
      raw += d.stream().size();
    }
    ASSERT_EQ((*e->ListCheckpoints("sz"))[0].raw_bytes, raw);
  }
  ASSERT_TRUE(RebuildWithoutCatalog(dir.path()).ok());
  auto e = OpenOk(dir.path());
  auto listed = e->ListCheckpoints("sz");
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  EXPECT_EQ((*listed)[0].raw_bytes, raw);
}

TEST(CatalogTest, MissingCatalogRefusesThenRebuilds) {
  TempDir dir;
  Store st = WriteStore(dir.path());
  int segs = CountFiles(dir.path() + "/segments");
  fs::remove_all(dir.path() + "/meta");
  ExpectRefusal(dir.path());
  EXPECT_EQ(CountFiles(dir.path() + "/segments"), segs);
  RebuildAndCheck(dir.path(), st);
  // No byte of segment data was deleted: what the catalog no longer knows is in quarantine.
  EXPECT_EQ(CountFiles(dir.path() + "/segments") + CountFiles(dir.path() + "/quarantine"), segs);
}

// A missing catalog beside segment files the opener cannot all see (a job directory it may
// not read) is refused like one beside visible data: a walk cut short never passes for "no
// segment data", which would make a new, empty catalog and quarantine what it could see.
// Run as an unprivileged user in a child (root reads everything); skipped when not root.
TEST(CatalogTest, MissingCatalogBesideUnreadableSegmentsRefuses) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged user";
  TempDir dir;
  Store st = WriteStore(dir.path());
  fs::remove_all(dir.path() + "/meta");
  const auto before = DirContents(dir.path());
  // The store's directories readable and writable by anyone, but the job's segment directory
  // only by root.
  fs::permissions(dir.path(), fs::perms::all);
  fs::permissions(dir.path() + "/segments", fs::perms::all);
  std::string job_dir;
  for (const auto& e : fs::directory_iterator(dir.path() + "/segments")) job_dir = e.path();
  ASSERT_FALSE(job_dir.empty());
  fs::permissions(job_dir, fs::perms::owner_all);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(100);
    EngineOptions o;
    o.data_dir = dir.path();
    auto e = Engine::Open(o);
    const bool says_why = !e.ok() && absl::StrContains(e.status().message(), "cannot list");
    ::_exit(e.ok() ? 0 : says_why ? static_cast<int>(e.status().code()) : 101);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  fs::permissions(job_dir, fs::perms::all);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(fs::exists(dir.path() + "/meta")) << "a new catalog was made beside the data";
  ExpectSameTree(before, DirContents(dir.path()));
  RebuildAndCheck(dir.path(), st);
}

// Job "fence" step 1 (one shard), begun and written in `epoch`.
void WriteFencedStep(Engine* e, uint64_t epoch) {
  CheckpointSpec spec = Spec("fence", 1, 1, -1);
  spec.epoch = epoch;
  ASSERT_TRUE(e->BeginCheckpoint(spec).ok());
  ShardData d = MakeShard("fence", 1, 0, 5, 1000);
  d.spec.epoch = epoch;
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
}

// A begin of job "fence" step 2 in `epoch` is refused as superseded.
void ExpectFencedOut(Engine* e, uint64_t epoch) {
  CheckpointSpec zombie = Spec("fence", 2, 1, -1);
  zombie.epoch = epoch;
  absl::Status s = e->BeginCheckpoint(zombie);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("superseded"), std::string::npos) << s;
}

// Writer epochs survive a lost catalog: the rebuilt one takes them from their mirrors
// (epochs/<job>), so a zombie of an older attempt is still refused and the next attempt gets a
// new number, not one handed out before. A mirror that does not check is reported, not used.
TEST(CatalogTest, RebuiltCatalogKeepsWriterEpochs) {
  TempDir dir;
  uint64_t epochs[3] = {};
  {
    auto e = OpenOk(dir.path());
    for (uint64_t& got : epochs) {
      auto a = e->AcquireEpoch("fence");
      ASSERT_TRUE(a.ok()) << a.status();
      got = *a;
    }
    ASSERT_LT(epochs[0], epochs[1]);
    ASSERT_LT(epochs[1], epochs[2]);
    ASSERT_NO_FATAL_FAILURE(WriteFencedStep(e.get(), epochs[2]));
  }
  std::ofstream(dir.path() + "/epochs/bogus", std::ios::binary) << "not an epoch";
  // A mirror's temporary left whole by a kill between its sync and its rename: not a job.
  fs::copy_file(dir.path() + "/epochs/fence", dir.path() + "/epochs/fence.tmp-99-0");
  auto report = RebuildWithoutCatalog(dir.path());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rebuilt.size(), 1u);
  ASSERT_EQ(report->epochs.size(), 1u);
  EXPECT_EQ(report->epochs[0], absl::StrCat("job fence: attempt ", epochs[2]));
  ASSERT_EQ(report->skipped.size(), 1u);
  EXPECT_NE(report->skipped[0].find("epochs/bogus"), std::string::npos) << report->skipped[0];
  auto e = OpenOk(dir.path());
  ExpectFencedOut(e.get(), epochs[1]);
  auto next = e->AcquireEpoch("fence");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GT(*next, epochs[2]);
}

// Without the mirrors (epochs/ lost with meta/), the rebuilt catalog takes each job's epoch from
// its shard footers (the writer's epoch and the job's epoch when the footer was written), so a
// zombie of an older attempt is still refused. Before, the job's epoch came back as 0 (none):
// every zombie was let in until the next acquisition.
TEST(CatalogTest, RebuiltCatalogTakesEpochsFromFootersWithoutMirrors) {
  TempDir dir;
  uint64_t epochs[2] = {};
  {
    auto e = OpenOk(dir.path());
    for (uint64_t& got : epochs) got = *e->AcquireEpoch("fence");
    ASSERT_NO_FATAL_FAILURE(WriteFencedStep(e.get(), epochs[1]));
  }
  fs::remove_all(dir.path() + "/epochs");
  auto report = RebuildWithoutCatalog(dir.path());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rebuilt.size(), 1u);
  ASSERT_EQ(report->epochs.size(), 1u);
  EXPECT_EQ(report->epochs[0], absl::StrCat("job fence: attempt ", epochs[1]));
  auto e = OpenOk(dir.path());
  ExpectFencedOut(e.get(), epochs[0]);
}

// A DELTA that a later DELTA of the same chain replays on cannot be deleted on its own (the
// later one would become unrestorable and the recovery point fall back silently): the chain
// is deleted from its end.
TEST(CatalogTest, DeleteRefusesADeltaALaterDeltaNeeds) {
  TempDir dir;
  auto e = OpenOk(dir.path());
  ASSERT_TRUE(e->BeginCheckpoint(Spec("ch", 1, 1)).ok());
  ShardData full = MakeShard("ch", 1, 0, 1, 1000);
  ASSERT_TRUE(e->WriteShard(full.spec, full.ptrs()).ok());
  for (int64_t step : {2, 3}) {
    ASSERT_TRUE(e->BeginCheckpoint(Spec("ch", step, 1, 1)).ok());
    ShardData d = MakeShard("ch", step, 0, step, 500);
    ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  }
  absl::Status s = e->Delete("ch", 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("chain of DELTA step 3"), std::string::npos) << s;
  EXPECT_EQ(e->ListCheckpoints("ch")->size(), 3u);
  EXPECT_EQ(e->Delete("ch", 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(e->Delete("ch", 3).ok());
  EXPECT_TRUE(e->Delete("ch", 2).ok());
  EXPECT_TRUE(e->Delete("ch", 1).ok());
}

// `rm` of the newest DELTA while its trainer writes on: the next DELTA of that chain is refused
// at its begin (the trainer cuts the chain and takes a FULL next), so no later DELTA is listed
// as committed without every DELTA it replays on.
TEST(CatalogTest, DeltaAfterADeletedDeltaOfItsChainIsRefused) {
  TempDir dir;
  auto e = OpenOk(dir.path());
  auto write = [&](int64_t step, int64_t base) {
    ASSERT_TRUE(e->BeginCheckpoint(Spec("ch", step, 1, base)).ok()) << step;
    ShardData d = MakeShard("ch", step, 0, step, 500);
    ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok()) << step;
  };
  write(1, -1);
  write(2, 1);
  ASSERT_TRUE(e->Delete("ch", 2).ok());
  const absl::Status s = e->BeginCheckpoint(Spec("ch", 3, 1, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("needs DELTA step 2 of its chain"), std::string::npos) << s;
  // Nor does a DELTA skip one of its chain, or sit on a DELTA of another chain.
  EXPECT_TRUE(absl::IsFailedPrecondition(e->BeginCheckpoint(Spec("ch", 4, 1, 1))));
  auto listed = e->ListCheckpoints("ch", /*include_pending=*/true);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  // The chain written again, step by step, is taken; a new FULL starts a chain of its own.
  write(2, 1);
  write(3, 1);
  write(4, -1);
  EXPECT_TRUE(absl::IsFailedPrecondition(e->BeginCheckpoint(Spec("ch", 6, 1, 4))));
  write(5, 4);
  EXPECT_EQ(e->ListCheckpoints("ch")->size(), 5u);
}

// A catalog made anew beside an old epoch mirror (its meta/ lost, no segment data) does not
// count epochs again from below the mirror's (raised here far above the clock, so only the
// mirror can give the next one).
TEST(CatalogTest, NewCatalogContinuesFromTheEpochMirror) {
  TempDir dir;
  const uint64_t high = uint64_t{1} << 50;
  {
    auto e = OpenOk(dir.path());
    ASSERT_TRUE(e->AcquireEpoch("again").ok());
    ASSERT_EQ(*e->RaiseEpoch("again", high), high);
  }
  fs::remove_all(dir.path() + "/meta");
  auto e = OpenOk(dir.path());  // no segment data: a new, empty catalog
  ASSERT_NE(e, nullptr);
  auto next = e->AcquireEpoch("again");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, high + 1);
}

// An abort carrying an older attempt's epoch (a zombie rank's rollback) is refused as
// superseded and leaves the new attempt's PENDING checkpoint alone; the current epoch, or none
// (an operator, the launcher), aborts it.
TEST(CatalogTest, AbortFromASupersededAttemptIsRefused) {
  TempDir dir;
  auto e = OpenOk(dir.path());
  const uint64_t older = *e->AcquireEpoch("zj");
  const uint64_t current = *e->AcquireEpoch("zj");
  ASSERT_GT(current, older);
  CheckpointSpec spec = Spec("zj", 7, 1);
  spec.epoch = current;
  ASSERT_TRUE(e->BeginCheckpoint(spec).ok());
  absl::Status s = e->AbortCheckpoint("zj", 7, older);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("superseded"), std::string::npos) << s;
  EXPECT_EQ(e->ListCheckpoints("zj", /*include_pending=*/true)->size(), 1u);
  EXPECT_TRUE(e->AbortCheckpoint("zj", 7, current).ok());
  EXPECT_TRUE(e->ListCheckpoints("zj", /*include_pending=*/true)->empty());
  ASSERT_TRUE(e->BeginCheckpoint(spec).ok());
  EXPECT_TRUE(e->AbortCheckpoint("zj", 7).ok());  // unfenced
}

TEST(CatalogTest, EmptiedCatalogRefuses) {
  TempDir dir;
  Store st = WriteStore(dir.path());
  for (const auto& e : fs::directory_iterator(dir.path() + "/meta")) fs::remove_all(e.path());
  ExpectRefusal(dir.path());
  RebuildAndCheck(dir.path(), st);
}

TEST(CatalogTest, DeletedCurrentRefuses) {
  TempDir dir;
  Store st = WriteStore(dir.path());
  fs::remove(dir.path() + "/meta/CURRENT");
  ExpectRefusal(dir.path());
  RebuildAndCheck(dir.path(), st);
  // The broken catalog is kept, not deleted.
  int old = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    if (e.path().filename().string().rfind("meta.old-", 0) == 0) ++old;
  }
  EXPECT_EQ(old, 1);
}

TEST(CatalogTest, CatalogWithoutCheckpointsRefuses) {
  TempDir dir;
  Store st = WriteStore(dir.path());
  fs::remove_all(dir.path() + "/meta");
  {
    auto m = MetaStore::Open(dir.path() + "/meta");  // a fresh, empty database
    ASSERT_TRUE(m.ok());
  }
  ExpectRefusal(dir.path());
  RebuildAndCheck(dir.path(), st);
}

TEST(CatalogTest, CorruptSstRefusesAndKeepsSegments) {
  TempDir dir;
  Store st = WriteStore(dir.path());
  { auto e = OpenOk(dir.path()); }  // recovery flushes the WAL into an SST
  int segs = CountFiles(dir.path() + "/segments");
  ASSERT_GT(CorruptSstFiles(dir.path() + "/meta"), 0);
  absl::Status s = OpenStatus(dir.path());
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("--rebuild-catalog"), std::string::npos) << s;
  EXPECT_EQ(CountFiles(dir.path() + "/segments"), segs);
  RebuildAndCheck(dir.path(), st);
}

TEST(CatalogTest, RebuildSkipsCorruptShardAndDryRunChangesNothing) {
  TempDir dir;
  Store st = WriteStore(dir.path());
  // Flip a byte in the first chunk of job b's only shard.
  std::string seg = dir.path() + "/segments/b/00000000000000000005/r0000000000-000000.seg";
  ASSERT_TRUE(testing::FlipByte(seg, 5000, 0x40).ok());
  EngineOptions o;
  o.data_dir = dir.path();
  auto before = DirContents(dir.path());
  auto dry = RebuildCatalog(o, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_EQ(dry->rebuilt.size(), 2u);
  EXPECT_EQ(dry->skipped.size(), 2u);  // b/5 fails verification, a/30 is incomplete
  ExpectSameTree(before, DirContents(dir.path()));
  auto report = RebuildCatalog(o, /*dry_run=*/false);
  ASSERT_TRUE(report.ok());
  auto e = OpenOk(dir.path());
  EXPECT_TRUE(HoldsNothingOf(e, "b"));
}

// A rebuild brings back no DELTA chain with a hole: with DELTA 12 of the chain 10 <- 11, 12, 13
// damaged, 13 (which replays on 12) is skipped too, naming the cut; the chain of FULL 20 is
// untouched. (The rebuild before this installed 13, listed and unrestorable.)
TEST(CatalogTest, RebuildSkipsTheDeltasAfterADamagedOne) {
  TempDir dir;
  {
    auto e = OpenOk(dir.path());
    for (const auto& [step, base] :
         std::vector<std::pair<int64_t, int64_t>>{{10, -1}, {11, 10}, {12, 10}, {13, 10},
                                                  {20, -1}, {21, 20}}) {
      ASSERT_TRUE(e->BeginCheckpoint(Spec("ch", step, 1, base)).ok()) << step;
      ShardData d = MakeShard("ch", step, 0, step, 100000);
      ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok()) << step;
    }
  }
  ASSERT_TRUE(testing::FlipByte(
                  dir.path() + "/segments/ch/00000000000000000012/r0000000000-000000.seg",
                  5000, 0x40)
                  .ok());
  EngineOptions o;
  o.data_dir = dir.path();
  auto report = RebuildCatalog(o, /*dry_run=*/false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rebuilt.size(), 4u);
  ASSERT_EQ(report->skipped.size(), 2u);
  EXPECT_NE(report->skipped[0].find("job ch step 12"), std::string::npos) << report->skipped[0];
  EXPECT_NE(report->skipped[1].find("job ch step 13: the DELTA before it on FULL step 10 "
                                    "(step 12) was not rebuilt"),
            std::string::npos)
      << report->skipped[1];
  auto e = OpenOk(dir.path());
  auto listed = e->ListCheckpoints("ch");
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<int64_t> steps;
  for (const CheckpointInfo& c : *listed) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 11, 20, 21}));
}

TEST(CatalogTest, UnknownSegmentDataIsQuarantinedAndGcPurgesAfterGrace) {
  TempDir dir;
  WriteStore(dir.path());
  const std::string stray = dir.path() + "/segments/a/00000000000000000010/r0000000000-000099.seg";
  const std::string orphan = dir.path() + "/segments/a/00000000000000000099";
  { std::ofstream(stray) << "not referenced"; }
  fs::create_directories(orphan);
  { std::ofstream(orphan + "/r0000000000-000000.seg") << "unknown checkpoint"; }
  FakeClock clock;
  EngineOptions o;
  o.data_dir = dir.path();
  o.quarantine_grace_seconds = 3600;
  o.clock = &clock;
  const int64_t quarantined = StorageStats::Get().quarantined->Value();
  const int64_t purged = StorageStats::Get().quarantine_purged->Value();
  {
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_FALSE(fs::exists(stray));
    EXPECT_FALSE(fs::exists(orphan));
    EXPECT_EQ(CountFiles(dir.path() + "/quarantine"), 2);
    EXPECT_EQ(StorageStats::Get().quarantined->Value(), quarantined + 2);
    std::string content;
    for (const auto& f : fs::recursive_directory_iterator(dir.path() + "/quarantine")) {
      const std::string p = f.path().string();
      const std::string tail = "/segments/a/00000000000000000099/r0000000000-000000.seg";
      if (p.size() > tail.size() && p.compare(p.size() - tail.size(), tail.size(), tail) == 0) {
        std::ifstream in(p);
        std::getline(in, content);
      }
    }
    EXPECT_EQ(content, "unknown checkpoint");  // moved whole, with its path
    // The entries are named by the engine's clock, and aged by it.
    EXPECT_TRUE(fs::is_directory(
        absl::StrFormat("%s/quarantine/%013d", dir.path(), clock.NowUnixMillis())));
    ASSERT_TRUE((*e)->Gc("a", GcPolicy{}).ok());
    EXPECT_EQ(CountFiles(dir.path() + "/quarantine"), 2);
    clock.AdvanceSeconds(3599);  // the last second of the grace period
    ASSERT_TRUE((*e)->Gc("a", GcPolicy{}).ok());
    EXPECT_EQ(CountFiles(dir.path() + "/quarantine"), 2);
    EXPECT_EQ(StorageStats::Get().quarantine_purged->Value(), purged);
    clock.AdvanceSeconds(1);
    ASSERT_TRUE((*e)->Gc("a", GcPolicy{}).ok());
    EXPECT_EQ(CountFiles(dir.path() + "/quarantine"), 0);
    EXPECT_EQ(StorageStats::Get().quarantine_purged->Value(), purged + 1);  // one entry, 2 files
  }
}

// The purge compares ages without overflow: a grace of INT64_MAX ("never") keeps an entry a
// year old, a grace of 0 removes it; names that are not timestamps are never touched.
TEST(CatalogTest, QuarantinePurgeHonoursAnyGrace) {
  TempDir dir;
  const int64_t now = int64_t{1800000000} * 1000;
  const int64_t year_ago = now - int64_t{365} * 24 * 3600 * 1000;
  for (const std::string& name : {std::to_string(year_ago), std::string("notes"),
                                  std::string("-5"), std::to_string(now + 60000)}) {
    fs::create_directories(dir.path() + "/quarantine/" + name);
  }
  auto kept = PurgeQuarantine(FileSystem::Default(), dir.path(), INT64_MAX, now);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, 0);
  EXPECT_TRUE(fs::exists(dir.path() + "/quarantine/" + std::to_string(year_ago)));
  auto purged = PurgeQuarantine(FileSystem::Default(), dir.path(), 0, now);
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 1);
  EXPECT_FALSE(fs::exists(dir.path() + "/quarantine/" + std::to_string(year_ago)));
  EXPECT_TRUE(fs::exists(dir.path() + "/quarantine/notes"));
  EXPECT_TRUE(fs::exists(dir.path() + "/quarantine/-5"));
  EXPECT_TRUE(fs::exists(dir.path() + "/quarantine/" + std::to_string(now + 60000)));
}

// A footer trailer that checks (magic, trailer CRC) but claims a payload near 2^64 bytes is
// DATA_LOSS, not a wrapped size check and a buffer of that many bytes (an abort).
TEST(CatalogTest, FooterClaimingAHugePayloadIsDataLoss) {
  TempDir dir;
  for (uint64_t claimed : {UINT64_MAX - 10, UINT64_MAX - kFooterTrailerSize + 1, uint64_t{1} << 40}) {
    internal::Out t;
    t(kFooterMagic, claimed, int64_t{0}, uint32_t{0});
    t(Crc32c(t.bytes().data(), t.bytes().size()));
    std::string file(4096 - t.bytes().size(), '\0');
    file += t.bytes();
    const std::string path = dir.path() + "/crafted.seg";
    std::ofstream(path, std::ios::binary) << file;
    auto f = ReadFooter(FileSystem::Default(), path);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << claimed << " " << f.status();
  }
}

// Footer version 2 records the job's epoch; a version-1 footer (format 4 and older) still
// reads, with job epoch 0.
TEST(CatalogTest, FooterRecordsTheJobEpochAndVersion1StillReads) {
  TempDir dir;
  ShardFooter f;
  f.checkpoint.spec = Spec("v", 3, 1, -1);
  f.shard.spec.job = "v";
  f.shard.spec.step = 3;
  f.shard.epoch = 7;
  f.job_epoch = 9;
  f.written_unix_ms = 1234;
  const std::string v2 = dir.path() + "/v2.seg";
  std::ofstream(v2, std::ios::binary) << EncodeFooter(f);
  auto got = ReadFooter(FileSystem::Default(), v2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->job_epoch, 9u);
  EXPECT_EQ(got->shard.epoch, 7u);
  internal::Out p;  // version 1: no job epoch
  p(uint8_t{1}, EncodeCheckpoint(f.checkpoint), EncodeShard(f.shard), uint32_t{0});
  const std::string payload = p.Take();
  internal::Out t;
  t(kFooterMagic, uint64_t{payload.size()}, int64_t{1234}, Crc32c(payload.data(), payload.size()));
  t(Crc32c(t.bytes().data(), t.bytes().size()));
  std::string file = payload;
  file.resize(4096 - t.bytes().size(), '\0');
  file += t.bytes();
  const std::string v1 = dir.path() + "/v1.seg";
  std::ofstream(v1, std::ios::binary) << file;
  got = ReadFooter(FileSystem::Default(), v1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->job_epoch, 0u);
  EXPECT_EQ(got->shard.epoch, 7u);
  EXPECT_EQ(got->written_unix_ms, 1234);
}

TEST(CatalogTest, StoredTimestampsComeFromTheEnginesClock) {
  TempDir dir;
  FakeClock clock;
  auto e = OpenOk(dir.path(), /*read_only=*/false, &clock);
  ASSERT_NE(e, nullptr);
  const int64_t begun = clock.NowUnixMillis();
  ASSERT_TRUE(e->BeginCheckpoint(Spec("t", 1, 1)).ok());
  clock.AdvanceSeconds(90);
  ShardData d = MakeShard("t", 1, 0, 1);
  ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
  auto m = e->GetManifest("t", 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->info.created_unix_ms, begun);
  EXPECT_EQ(m->info.committed_unix_ms, begun + 90'000);
}

TEST(CatalogTest, DeltaWaitsForItsBaseAndIsAbortedWithIt) {
  TempDir dir;
  auto e = OpenOk(dir.path());
  // The three-RPC orphan sequence: Begin FULL 10, Begin + Write DELTA 11, Abort 10.
  ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 10, 1)).ok());
  ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 11, 1, 10)).ok());
  ShardData d11 = MakeShard("j", 11, 0, 11);
  ASSERT_TRUE(e->WriteShard(d11.spec, d11.ptrs()).ok());
  auto listed = e->ListCheckpoints("j", false);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty()) << "a DELTA must not commit before its base";
  EXPECT_TRUE(absl::IsFailedPrecondition(e->OpenShardReader("j", 11, 0).status()));
  ASSERT_TRUE(e->AbortCheckpoint("j", 10).ok());
  auto all = e->ListCheckpoints("j", true);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty()) << "the waiting DELTA goes with its base";

  // The base commits after its DELTA was written: both commit in one batch.
  ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 20, 1)).ok());
  ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 21, 1, 20)).ok());
  ShardData d21 = MakeShard("j", 21, 0, 21);
  ASSERT_TRUE(e->WriteShard(d21.spec, d21.ptrs()).ok());
  ShardData d20 = MakeShard("j", 20, 0, 20);
  ASSERT_TRUE(e->WriteShard(d20.spec, d20.ptrs()).ok());
  listed = e->ListCheckpoints("j", false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  ExpectRestores(e.get(), d21);
  // A FULL with a committed DELTA can neither be deleted nor aborted.
  EXPECT_TRUE(absl::IsFailedPrecondition(e->Delete("j", 20)));
  EXPECT_TRUE(absl::IsFailedPrecondition(e->AbortCheckpoint("j", 20)));
  ASSERT_TRUE(e->Delete("j", 21).ok());
  ASSERT_TRUE(e->Delete("j", 20).ok());
}

// A launcher rolls back a dead attempt's PENDING checkpoint while the server may still be
// tearing the dead upload down: the refusal is ABORTED (retried), and the abort succeeds once
// the writer is closed.
TEST(CatalogTest, AbortWhileAWriterIsOpenIsRetryable) {
  TempDir dir;
  auto e = OpenOk(dir.path());
  ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 10, 1)).ok());
  ShardData d = MakeShard("j", 10, 0, 10);
  auto w = e->OpenShardWriter(d.spec);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(d.bytes[0].data(), 4096).ok());
  const absl::Status busy = e->AbortCheckpoint("j", 10);
  EXPECT_TRUE(absl::IsAborted(busy)) << busy;
  EXPECT_NE(busy.message().find("has an open writer"), std::string::npos) << busy;
  EXPECT_TRUE(absl::IsAborted(e->Delete("j", 10)));
  w->reset();  // the upload ends (a dead client's stream is torn down the same way)
  ASSERT_TRUE(e->AbortCheckpoint("j", 10).ok());
  EXPECT_TRUE(HoldsNothingOf(e, "j"));
}

TEST(CatalogTest, RecoveryDropsCommittedDeltaWithoutBase) {
  TempDir dir;
  {
    auto e = OpenOk(dir.path());
    ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 10, 1)).ok());
    ShardData d = MakeShard("j", 10, 0, 1);
    ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
    ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 11, 1, 10)).ok());
    ShardData d11 = MakeShard("j", 11, 0, 2);
    ASSERT_TRUE(e->WriteShard(d11.spec, d11.ptrs()).ok());
  }
  {
    // What an older version could leave: the base's records gone, the DELTA committed.
    auto m = MetaStore::Open(dir.path() + "/meta", MetaStore::Mode::kExisting);
    ASSERT_TRUE(m.ok());
    MetaStore::Batch b;
    b.deletes.push_back(CheckpointKey("j", 10));
    b.delete_prefixes.push_back(ShardPrefix("j", 10));
    b.delete_prefixes.push_back(ChunkStepPrefix("j", 10));
    ASSERT_TRUE((*m)->Commit(b).ok());
  }
  auto e = OpenOk(dir.path());
  EXPECT_TRUE(HoldsNothingOf(e, "j"));
  EXPECT_FALSE(fs::exists(dir.path() + "/segments/j/00000000000000000011"));
  // The DELTA's and the FULL's segment file, each quarantined once, and the DELETED marker
  // written into the DELTA's before it was dropped (no rebuild brings it back).
  EXPECT_EQ(CountFiles(dir.path() + "/quarantine"), 3);
}

TEST(CatalogTest, CorruptDurablePrefixFailsResumeWithDataLoss) {
  TempDir dir;
  ShardData d = MakeShard("j", 1, 0, 7, 3000000);  // 12 MB tensor: several chunks
  {
    auto e = OpenOk(dir.path());
    ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 1, 1)).ok());
    auto w = e->OpenShardWriter(d.spec);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(d.bytes[0].data(), 6000000).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  ASSERT_TRUE(testing::FlipByte(
                  dir.path() + "/segments/j/00000000000000000001/r0000000000-000000.seg", 100, 0x40)
                  .ok());
  auto e = OpenOk(dir.path());
  for (int i = 0; i < 3; ++i) {  // the reservation is given back every time
    auto w = e->OpenShardWriter(d.spec);
    EXPECT_TRUE(absl::IsDataLoss(w.status())) << w.status();
  }
  ASSERT_TRUE(e->AbortCheckpoint("j", 1).ok());
}

TEST(CatalogTest, ReadOnlyOpenWritesNothing) {
  TempDir dir;
  Store st = WriteStore(dir.path());
  { auto e = OpenOk(dir.path()); }
  auto before = DirContents(dir.path());
  {
    auto e = OpenOk(dir.path(), /*read_only=*/true);
    ASSERT_NE(e, nullptr);
    auto jobs = e->ListJobs();
    ASSERT_TRUE(jobs.ok());
    EXPECT_EQ(jobs->size(), 2u);
    EXPECT_TRUE(e->Verify("a", 10).ok());
    ExpectRestores(e.get(), st.committed[0]);
    EXPECT_TRUE(absl::IsFailedPrecondition(e->BeginCheckpoint(Spec("a", 40, 1))));
    EXPECT_TRUE(absl::IsFailedPrecondition(e->Delete("a", 11)));
    // A second, read-write engine may hold the directory at the same time.
    auto rw = OpenOk(dir.path());
    EXPECT_NE(rw, nullptr);
  }
  // (the read-write open above may legitimately add RocksDB files; compare segments only)
  auto after = DirContents(dir.path());
  for (const auto& [k, v] : before) {
    if (k.rfind(dir.path() + "/segments", 0) == 0) {
      EXPECT_EQ(after[k], v) << k;
    }
  }
  TempDir empty;
  EngineOptions o;
  o.data_dir = empty.path();
  o.read_only = true;
  EXPECT_TRUE(absl::IsNotFound(Engine::Open(o).status()));
  EXPECT_TRUE(fs::is_empty(empty.path()));
}

TEST(CatalogTest, FailedCreateLeavesNothingBehind) {
  TempDir dir;
  FaultInjectionFileSystem ffs;
  ffs.SimulateCrash();  // every file-system call of the engine fails from now on
  EngineOptions o;
  o.data_dir = dir.path() + "/new";
  o.fs = &ffs;
  EXPECT_FALSE(Engine::Open(o).ok());
  EXPECT_FALSE(fs::exists(o.data_dir));
  // An existing, empty directory stays exactly as it was.
  fs::create_directories(dir.path() + "/empty/meta");
  o.data_dir = dir.path() + "/empty";
  auto before = DirContents(o.data_dir);
  EXPECT_FALSE(Engine::Open(o).ok());
  ExpectSameTree(before, DirContents(o.data_dir));
  // No free space for the catalog: RESOURCE_EXHAUSTED, nothing created.
  o.fs = nullptr;
  o.data_dir = dir.path() + "/full";
  o.catalog_reserve_bytes = ~uint64_t{0};
  EXPECT_TRUE(absl::IsResourceExhausted(Engine::Open(o).status()));
  EXPECT_FALSE(fs::exists(o.data_dir));
}

TEST(CatalogTest, CreationKilledHalfWayStartsOver) {
  TempDir dir;
  // Killed while the new catalog was being made: meta.new/ is scratch, there is no meta/.
  fs::create_directories(dir.path() + "/a/meta.new");
  { std::ofstream(dir.path() + "/a/meta.new/LOG") << "partial"; }
  auto e = OpenOk(dir.path() + "/a");
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->BeginCheckpoint(Spec("j", 1, 1)).ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/a/meta.new"));
  // An older version killed while creating meta/ in place: files but no CURRENT, and no
  // segment data. It is kept aside and a new catalog made.
  fs::create_directories(dir.path() + "/b/meta");
  { std::ofstream(dir.path() + "/b/meta/000003.log") << "partial"; }
  auto e2 = OpenOk(dir.path() + "/b");
  ASSERT_NE(e2, nullptr);
  int aside = 0;
  for (const auto& entry : fs::directory_iterator(dir.path() + "/b")) {
    aside += entry.path().filename().string().rfind("meta.broken-", 0) == 0;
  }
  EXPECT_EQ(aside, 1);
}

TEST(CatalogTest, FullDiskGivesResourceExhaustedAndReadsGoOn) {
  TempDir dir;
  FaultInjectionFileSystem ffs;
  auto e = OpenOn(&ffs, dir.path());
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 1, 1)).ok());
  ShardData d1 = MakeShard("j", 1, 0, 1);
  ASSERT_TRUE(e->WriteShard(d1.spec, d1.ptrs()).ok());
  // MakeShard's shard is three writes: w's chunk, g and step packed into one, the footer.
  for (int64_t at = 1; at <= 3; ++at) {
    FaultInjectionFileSystem::Faults f;
    f.fail_write_at = at;
    f.enospc = true;
    f.crash_on_fault = false;
    ffs.Reset();
    ffs.SetFaults(f);
    int64_t step = 10 + at;
    ASSERT_TRUE(e->BeginCheckpoint(Spec("j", step, 1)).ok());
    ShardData d = MakeShard("j", step, 0, step);
    absl::Status s = e->WriteShard(d.spec, d.ptrs());
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << "write " << at << ": " << s;
    ExpectRestores(e.get(), d1);
    EXPECT_TRUE(e->Verify("j", 1).ok());
    ASSERT_TRUE(e->AbortCheckpoint("j", step).ok());
  }
}

// A real disk filled by checkpoint data (a 64 MiB tmpfs): segment writes stop short of the
// last kSegmentFloorBytes, so a delete can still commit and free space, and writes go on
// after it. Before, segment data took the disk to 0 bytes and rm and gc were refused too.
TEST(CatalogTest, DiskFilledByDataStillLetsDeletesFreeSpace) {
  TempDir dir;
  gradsnap::testing::Tmpfs tmpfs(dir.path() + "/small");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  auto e = OpenOk(dir.path() + "/small/data");
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->BeginCheckpoint(Spec("full", 1, 1, -1)).ok());
  ShardData first = MakeShard("full", 1, 0, 1, 4 << 20);  // 16 MiB
  ASSERT_TRUE(e->WriteShard(first.spec, first.ptrs()).ok());
  // Begun with room to spare, then larger than what is left: the disk fills up under it.
  ASSERT_TRUE(e->BeginCheckpoint(Spec("full", 2, 1, -1)).ok());
  ShardData big = MakeShard("full", 2, 0, 2, 16 << 20);  // 64 MiB
  absl::Status s = e->WriteShard(big.spec, big.ptrs());
  ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
  absl::Status aborted = e->AbortCheckpoint("full", 2);
  EXPECT_TRUE(aborted.ok()) << "abort on a full disk: " << aborted;
  absl::Status d = e->Delete("full", 1);
  EXPECT_TRUE(d.ok()) << "rm on a full disk: " << d;
  ASSERT_TRUE(e->BeginCheckpoint(Spec("full", 3, 1, -1)).ok());
  ShardData again = MakeShard("full", 3, 0, 3, 4 << 20);
  EXPECT_TRUE(e->WriteShard(again.spec, again.ptrs()).ok());
}

// Job "j"'s FULLs at `steps` (world size 1) written into the store in `dir`, appended to
// *written.
void WriteFulls(const std::string& dir, const std::vector<int64_t>& steps,
                std::vector<ShardData>* written) {
  auto e = OpenOk(dir);
  ASSERT_NE(e, nullptr);
  for (int64_t step : steps) {
    ASSERT_TRUE(e->BeginCheckpoint(Spec("j", step, 1)).ok());
    ShardData d = MakeShard("j", step, 0, static_cast<uint64_t>(step));
    ASSERT_TRUE(e->WriteShard(d.spec, d.ptrs()).ok());
    written->push_back(std::move(d));
  }
}

// The catalog of `dir` as it is now, to put back later (PutBackCatalog): a backup of meta/.
void CopyCatalog(const std::string& dir, const std::string& to) {
  fs::copy(dir + "/meta", to, fs::copy_options::recursive);
}
void PutBackCatalog(const std::string& from, const std::string& dir) {
  fs::remove_all(dir + "/meta");
  fs::rename(from, dir + "/meta");
}

// A stale but readable catalog in `data`: FULLs at `known` steps, the catalog copied (to
// `backup`), FULLs at `newer` steps, the copy put back.
void MakeStaleCatalog(const std::string& data, const std::string& backup,
                      const std::vector<int64_t>& known, const std::vector<int64_t>& newer,
                      std::vector<ShardData>* written) {
  WriteFulls(data, known, written);
  CopyCatalog(data, backup);
  WriteFulls(data, newer, written);
  PutBackCatalog(backup, data);
}

// Job j steps 5 and 10, the catalog copied, steps 15..30, the copy put back (a stale but
// readable catalog): the open is refused naming --rebuild-catalog and changes nothing, and the
// rebuild brings every step back. Before, the open quarantined steps 15..30 with a warning
// each, and a job resuming from `latest` went back to step 10 without an error.
TEST(CatalogTest, StaleCatalogIsRefusedAndTheRebuildBringsEveryStepBack) {
  TempDir dir;
  const std::string data = dir.path() + "/d";
  std::vector<ShardData> written;
  MakeStaleCatalog(data, dir.path() + "/meta.backup", {5, 10}, {15, 20, 25, 30}, &written);
  auto before = DirContents(data);
  absl::Status s = OpenStatus(data);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "4 whole checkpoints newer than its catalog knows "
                                             "(job j step 15, job j step 20")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--rebuild-catalog")) << s;
  ExpectSameTree(before, DirContents(data));
  EXPECT_FALSE(fs::exists(data + "/quarantine"));
  auto report = Rebuild(data);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rebuilt.size(), 6u);
  auto e = OpenOk(data);
  ASSERT_NE(e, nullptr);
  auto listed = e->ListCheckpoints("j");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 6u);
  for (const ShardData& d : written) ExpectRestores(e.get(), d);
}

// What the open of a stale catalog did before the guard (steps 15 and 20 quarantined): the
// rebuild reads quarantine/ too and brings the whole checkpoints there back. Before, the
// rebuild read segments/ only and they stayed lost (then purged by gc after the grace).
TEST(CatalogTest, RebuildBringsBackWholeCheckpointsFromQuarantine) {
  TempDir dir;
  const std::string data = dir.path() + "/d";
  std::vector<ShardData> written;
  MakeStaleCatalog(data, dir.path() + "/meta.backup", {5, 10}, {15, 20}, &written);
  for (int64_t step : {15, 20}) {
    ASSERT_TRUE(QuarantinePath(FileSystem::Default(), data,
                               absl::StrFormat("%s/segments/j/%020d", data, step), "test",
                               1000 * step)
                    .ok());
  }
  {
    auto e = OpenOk(data);  // nothing in segments/ is newer than the catalog now
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->ListCheckpoints("j")->size(), 2u);
  }
  EngineOptions o;
  o.data_dir = data;
  auto dry = RebuildCatalog(o, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_EQ(dry->from_quarantine.size(), 2u);
  EXPECT_TRUE(fs::exists(absl::StrFormat("%s/quarantine/%013d/segments/j/%020d", data,
                                         15000, 15)));  // a dry run moves nothing
  auto report = Rebuild(data);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->from_quarantine.size(), 2u);
  EXPECT_EQ(report->rebuilt.size(), 4u);
  auto e = OpenOk(data);
  ASSERT_NE(e, nullptr);
  for (const ShardData& d : written) ExpectRestores(e.get(), d);
}

// What interrupted normal work leaves above the catalog's newest step is quarantined as
// before, not refused: a shard whose footer was never written (a write cut short), a
// checkpoint whose rm was stopped after its catalog commit (its DELETED marker), and, after a
// rebuild, a whole checkpoint the rebuild skipped (it fails verification): the rebuild
// quarantines it itself, so the next open is not refused for it.
TEST(CatalogTest, InterruptedWorkAboveTheCatalogIsQuarantinedNotRefused) {
  TempDir dir;
  const std::string data = dir.path() + "/d";
  std::vector<ShardData> written;
  WriteFulls(data, {5}, &written);
  CopyCatalog(data, dir.path() + "/meta.backup");
  {
    auto e = OpenOk(data);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->BeginCheckpoint(Spec("j", 10, 1)).ok());
    ShardData d = MakeShard("j", 10, 0, 10);
    auto w = e->OpenShardWriter(d.spec);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(d.bytes[0].data(), 4096).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  WriteFulls(data, {15}, &written);
  { std::ofstream(absl::StrFormat("%s/segments/j/%020d/%s", data, 15, kDeletedMarker)); }
  PutBackCatalog(dir.path() + "/meta.backup", data);
  {
    auto e = OpenOk(data);
    ASSERT_NE(e, nullptr);
  }
  EXPECT_FALSE(fs::exists(absl::StrFormat("%s/segments/j/%020d", data, 10)));
  EXPECT_FALSE(fs::exists(absl::StrFormat("%s/segments/j/%020d", data, 15)));
  // A whole checkpoint that does not verify, above the newest step: skipped by the rebuild.
  WriteFulls(data, {20}, &written);
  ASSERT_TRUE(testing::FlipByte(absl::StrFormat("%s/segments/j/%020d/r0000000000-000000.seg",
                                                data, 20),
                                5000, 0x40)
                  .ok());
  auto report = Rebuild(data);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rebuilt.size(), 1u);
  EXPECT_FALSE(fs::exists(absl::StrFormat("%s/segments/j/%020d", data, 20)));
  auto e = OpenOk(data);
  ASSERT_NE(e, nullptr);
  ExpectRestores(e.get(), written[0]);
}

// Waits (at most 5 s) until `e` takes writes again: the space of files just read and deleted
// comes back once the kernel tears down the io_uring rings that read them, a moment after.
bool WaitForWrites(Engine* e) {
  for (int i = 0; i < 50 && e->WriteSpace().writes_refused; ++i) usleep(100 * 1000);
  return !e->WriteSpace().writes_refused;
}

// A node whose disk is full when it (re)starts (a ballast file left 3 MiB, below the
// catalog's 16 MiB reserve): it opens refusing writes instead of not at all, serves list,
// restore and verify, frees space through gc, and takes writes again once space is back,
// without a reopen. With less than a delete needs (512 KiB) its catalog opens read-only:
// restores still work, deletes wait for a restart. Before, Open was RESOURCE_EXHAUSTED
// ("not enough free space to open ... for writing"), so a full node served nothing.
TEST(CatalogTest, FullNodeOpensRefusingWritesAndTakesThemOnceSpaceIsBack) {
  TempDir dir;
  gradsnap::testing::Tmpfs tmpfs(dir.path() + "/small");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  const std::string data = dir.path() + "/small/data";
  ShardData first = MakeShard("full", 1, 0, 1, 4 << 20);  // 16 MiB each
  ShardData second = MakeShard("full", 2, 0, 2, 4 << 20);
  {
    auto e = OpenOk(data);
    ASSERT_NE(e, nullptr);
    for (const ShardData* d : {&first, &second}) {
      ASSERT_TRUE(e->BeginCheckpoint(Spec("full", d->spec.step, 1)).ok());
      ASSERT_TRUE(e->WriteShard(d->spec, d->ptrs()).ok());
    }
  }
  gradsnap::testing::FillUpLeaving(dir.path() + "/small/ballast", 3 << 20);
  {
    auto e = OpenOk(data);
    ASSERT_NE(e, nullptr);
    WriteSpaceState space = e->WriteSpace();
    EXPECT_TRUE(space.writes_refused);
    EXPECT_FALSE(space.restart_needed);
    EXPECT_LT(space.free_bytes, space.reserve_bytes);
    auto listed = e->ListCheckpoints("full");
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->size(), 2u);
    ExpectRestores(e.get(), first);
    EXPECT_TRUE(e->Verify("full", 2).ok());
    absl::Status begun = e->BeginCheckpoint(Spec("full", 3, 1));
    EXPECT_TRUE(absl::IsResourceExhausted(begun)) << begun;
    EXPECT_TRUE(absl::StrContains(begun.message(), "below the catalog's reserve")) << begun;
    absl::Status epoch = e->AcquireEpoch("full").status();
    EXPECT_TRUE(absl::IsResourceExhausted(epoch)) << epoch;
    EXPECT_FALSE(fs::exists(data + "/epochs/full"));  // refused before its mirror too
    GcPolicy keep_one;
    keep_one.keep_last = 1;
    auto gc = e->Gc("full", keep_one);
    ASSERT_TRUE(gc.ok()) << "gc on a full node: " << gc.status();
    EXPECT_EQ(gc->deleted_steps, std::vector<int64_t>{1});
    EXPECT_TRUE(WaitForWrites(e.get()));  // space back: writes again, no reopen
    ASSERT_TRUE(e->BeginCheckpoint(Spec("full", 3, 1)).ok());
    ShardData third = MakeShard("full", 3, 0, 3);
    EXPECT_TRUE(e->WriteShard(third.spec, third.ptrs()).ok());
    EXPECT_TRUE(e->Verify("full", 3).ok());
  }
  gradsnap::testing::FillUpLeaving(dir.path() + "/small/ballast2", 512 << 10);
  {
    auto e = OpenOk(data);
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(e->WriteSpace().restart_needed);
    ExpectRestores(e.get(), second);
    absl::Status d = e->Delete("full", 3);
    EXPECT_TRUE(absl::IsResourceExhausted(d)) << d;
    EXPECT_TRUE(absl::StrContains(d.message(), "restart")) << d;
  }
  fs::remove(dir.path() + "/small/ballast2");
  fs::remove(dir.path() + "/small/ballast");
  auto e = OpenOk(data);
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(e->WriteSpace().writes_refused);
  EXPECT_TRUE(e->Delete("full", 3).ok());
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
