// Every error path of open/init/write/commit under the fault-injecting file system, through
// both the pwrite and the io_uring paths: ENOSPC and EIO at every write (io_uring completions
// included), EIO at every sync, a failed metadata commit at every commit, a short io_uring
// completion at every write. Each fault surfaces as a Status with its own code (never OK, never
// an abort, never a retryable code for an EIO); the engine stays usable (the shard resumes once
// the fault is gone and restores byte for byte), and a reopened engine recovers.
#include <string>

#include "common/status.h"
#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/fault_injection_fs.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

enum class Fault { kWriteEnospc, kWriteEio, kSyncEio, kCommit, kShortWrite };

const char* Name(Fault f) {
  switch (f) {
    case Fault::kWriteEnospc: return "write ENOSPC";
    case Fault::kWriteEio: return "write EIO";
    case Fault::kSyncEio: return "sync EIO";
    case Fault::kCommit: return "metadata commit";
    case Fault::kShortWrite: return "short io_uring write";
  }
  return "?";
}

// The code each fault must surface as (common/status.h): ENOSPC is RESOURCE_EXHAUSTED, an EIO
// on a write or a sync is DATA_LOSS (what was written cannot be trusted), a failed metadata
// commit UNAVAILABLE (the fault-injecting file system's crash-before-commit), and a short
// io_uring completion is requeued, so no error at all.
absl::StatusCode ExpectedCode(Fault f) {
  switch (f) {
    case Fault::kWriteEnospc: return absl::StatusCode::kResourceExhausted;
    case Fault::kWriteEio:
    case Fault::kSyncEio: return absl::StatusCode::kDataLoss;
    case Fault::kCommit: return absl::StatusCode::kUnavailable;
    case Fault::kShortWrite: return absl::StatusCode::kOk;
  }
  return absl::StatusCode::kUnknown;
}

struct Counts {
  int64_t writes = 0, syncs = 0, commits = 0;
};

EngineOptions Options(const std::string& dir, FaultInjectionFileSystem* ffs, bool uring) {
  EngineOptions o;
  o.data_dir = dir;
  o.fs = ffs;
  o.chunk_bytes = 64 << 10;  // many chunks: many call sites
  o.use_io_uring = uring;
  return o;
}

CheckpointSpec Spec(int64_t step) {
  CheckpointSpec s;
  s.job = "audit";
  s.step = step;
  return s;
}

// One checkpoint: Begin, a writer that Flushes half way, Finish. Returns the first error.
absl::Status Workload(Engine* e, const ShardData& d) {
  RETURN_IF_ERROR(e->BeginCheckpoint(Spec(d.spec.step)));
  auto w = e->OpenShardWriter(d.spec);
  RETURN_IF_ERROR(w.status());
  std::vector<uint8_t> stream = d.stream();
  uint64_t from = (*w)->committed_size();
  uint64_t half = stream.size() / 2;
  if (from < half) {
    RETURN_IF_ERROR((*w)->Append(stream.data() + from, half - from));
    RETURN_IF_ERROR((*w)->Flush());
    from = half;
  }
  RETURN_IF_ERROR((*w)->Append(stream.data() + from, stream.size() - from));
  return (*w)->Finish();
}

void Audit(bool uring) {
  const ShardData d = MakeShard("audit", 1, 0, 42, 120000);
  Counts clean;
  {
    TempDir dir;
    FaultInjectionFileSystem ffs;
    ffs.set_real_descriptors(uring);
    auto e = Engine::Open(Options(dir.path(), &ffs, uring));
    ASSERT_TRUE(e.ok()) << e.status();
    ffs.Reset();
    ASSERT_TRUE(Workload(e->get(), d).ok());
    clean = {ffs.writes(), ffs.syncs(), ffs.commits()};
  }
  ASSERT_GT(clean.writes, 4);
  for (Fault fault : {Fault::kWriteEnospc, Fault::kWriteEio, Fault::kSyncEio, Fault::kCommit,
                      Fault::kShortWrite}) {
    if (fault == Fault::kShortWrite && !uring) continue;
    int64_t sites = fault == Fault::kSyncEio  ? clean.syncs
                    : fault == Fault::kCommit ? clean.commits
                                              : clean.writes;
    for (int64_t at = 1; at <= sites; ++at) {
      SCOPED_TRACE(::testing::Message()
                   << Name(fault) << " at " << at << (uring ? " (io_uring)" : " (pwrite)"));
      TempDir dir;
      FaultInjectionFileSystem ffs;
      ffs.set_real_descriptors(uring);
      {
        auto e = Engine::Open(Options(dir.path(), &ffs, uring));
        ASSERT_TRUE(e.ok()) << e.status();
        FaultInjectionFileSystem::Faults f;
        f.crash_on_fault = false;
        f.enospc = fault == Fault::kWriteEnospc;
        if (fault == Fault::kWriteEnospc || fault == Fault::kWriteEio) f.fail_write_at = at;
        if (fault == Fault::kSyncEio) f.fail_sync_at = at;
        if (fault == Fault::kCommit) f.fail_commit_at = at;
        if (fault == Fault::kShortWrite) f.short_write_at = at;
        ffs.Reset();
        ffs.SetFaults(f);
        absl::Status s = Workload(e->get(), d);
        // Every injected fault surfaces with its code: none is swallowed (a checkpoint whose
        // fsync failed is not durable, so reporting it saved would lie). Each site was checked:
        // none legitimately succeeds, since the workload's every write and sync is its own.
        EXPECT_EQ(s.code(), ExpectedCode(fault)) << s;
        // And it is the injected fault that surfaced, not some later symptom of it.
        if (fault != Fault::kShortWrite) {
          const std::string what(s.message());
          EXPECT_TRUE(what.find("injected") != std::string::npos ||
                      what.find("io_uring write") != std::string::npos)
              << s;
        }
        // The fault is gone: the same engine finishes the checkpoint (resuming the shard).
        ffs.Reset();
        if (!s.ok()) {
          absl::Status again = Workload(e->get(), d);
          EXPECT_TRUE(again.ok()) << again;
        }
        ExpectRestores(e->get(), d);
      }
      // And a reopened engine recovers it.
      auto e = Engine::Open(Options(dir.path(), &ffs, uring));
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_TRUE((*e)->Verify("audit", 1).ok());
    }
  }
}

TEST(FaultAuditTest, EveryErrorPathPwrite) { Audit(/*uring=*/false); }
TEST(FaultAuditTest, EveryErrorPathIoUring) { Audit(/*uring=*/true); }

}  // namespace
}  // namespace storage
}  // namespace gradsnap
