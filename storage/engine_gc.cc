// EngineImpl, removal: Delete (refused for a checkpoint a DELTA still replays on) and Gc (the
// FULLs kept by keep_last and keep_every, the rest deleted with their DELTAs, and the
// quarantine purged of what outlived its grace; the policy itself is common/gc_plan.h, and
// GcSteps deletes the FULLs it or the remote client chose).
//
// LOCKING: mu_ guards the catalog's read-modify-write. Delete takes it; DeleteLocked requires
// it and takes the leaf writers_mu_ to refuse a checkpoint with an open writer. Gc verifies
// the FULLs it keeps outside mu_ (a verify reads whole checkpoints); GcSteps takes it to
// delete.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/epoch.h"
#include "common/gc_plan.h"
#include "storage/quarantine.h"
#include "storage/rebuild.h"

namespace gradsnap {
namespace storage {

void EngineImpl::MarkDeleted(const std::string& job, int64_t step) {
  const std::string dir = CheckpointDir(job, step);
  absl::Status marked = [&]() -> absl::Status {
    OpenOptions o;
    o.write = o.create = true;
    ASSIGN_OR_RETURN(std::unique_ptr<File> f, fs_->Open(dir + "/" + kDeletedMarker, o));
    RETURN_IF_ERROR(f->Sync());
    return fs_->SyncDir(dir);
  }();
  if (!marked.ok() && !absl::IsNotFound(marked)) {  // NOT_FOUND: no files to mark
    GS_LOG(WARNING) << "storage: deleting job " << job << " step " << step
                    << " without its marker: " << marked.message();
  }
}

absl::Status EngineImpl::DeleteLocked(const std::string& job, int64_t step, uint64_t* reclaimed,
                                      const std::string& quarantine_reason) {
  {
    absl::MutexLock lock(&writers_mu_);
    for (const std::string& key : active_writers_) {
      if (key.rfind(ShardPrefix(job, step), 0) == 0) {
        // Transient: a writer closes when its upload ends, also when the uploading process
        // died (the server notices the broken stream). A launcher rolling back a dead
        // attempt's PENDING checkpoints races that teardown, so the code is one clients retry.
        return absl::AbortedError(absl::StrCat("checkpoint job ", job, " step ", step,
                                               " has an open writer (retry once it closes)"));
      }
    }
  }
  ASSIGN_OR_RETURN(auto shards, meta_->Scan(ShardPrefix(job, step)));
  for (const auto& [k, v] : shards) {
    ShardRecord r;
    if (DecodeShard(v, &r).ok()) {
      for (const SegmentRef& s : r.segments) *reclaimed += s.durable_end;
    }
  }
  MarkDeleted(job, step);
  const MetaStore::Batch b = MetaStore::DeleteCheckpointBatch(job, step);
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  RETURN_IF_ERROR(meta_->Commit(b));
  // Metadata is gone: the files are now orphans, which recovery would also remove.
  if (quarantine_reason.empty()) return fs_->RemoveAll(CheckpointDir(job, step));
  if (!fs_->ListDir(CheckpointDir(job, step)).ok()) return absl::OkStatus();  // no files
  return QuarantinePath(fs_, options_.data_dir, CheckpointDir(job, step), quarantine_reason,
                        options_.clock->NowUnixMillis());
}

absl::Status EngineImpl::Delete(const std::string& job, int64_t step, uint64_t epoch) {
  RETURN_IF_ERROR(CheckJobChange(job));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpointToChangeLocked(job, step, epoch));
  RETURN_IF_ERROR(NothingDependsOnLocked(ckpt));
  uint64_t reclaimed = 0;
  return DeleteLocked(job, step, &reclaimed);
}

absl::Status EngineImpl::Quarantine(const std::string& job, int64_t step,
                                    const std::string& reason) {
  RETURN_IF_ERROR(CheckJobChange(job));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpointToChangeLocked(job, step, 0));
  if (ckpt.state != CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint job ", job, " step ", step, " is PENDING: not quarantined while written"));
  }
  RETURN_IF_ERROR(NothingDependsOnLocked(ckpt));
  uint64_t reclaimed = 0;
  return DeleteLocked(job, step, &reclaimed, reason);
}

absl::Status EngineImpl::NothingDependsOnLocked(const CheckpointRecord& ckpt) {
  const std::string& job = ckpt.spec.job;
  const int64_t step = ckpt.spec.step;
  if (ckpt.spec.kind == CheckpointKind::kFull) {
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> on_it, DeltasOf(job, step));
    if (!on_it.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint job ", job, " step ", step, " is the base of DELTA step ",
          on_it.front().spec.step));
    }
  } else {
    // A DELTA replays on every DELTA of its chain before it: one with a later step on the same
    // FULL needs this one.
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> chain, DeltasOf(job, ckpt.spec.base_step));
    for (const CheckpointRecord& d : chain) {
      if (d.spec.step > step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint job ", job, " step ", step, " is in the chain of DELTA step ",
            d.spec.step, " (each DELTA replays on the ones before it): delete that first"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GcResult> EngineImpl::Gc(const std::string& job, const GcPolicy& policy,
                                        uint64_t epoch) {
  RETURN_IF_ERROR(CheckJobChange(job));
  {
    absl::MutexLock lock(&mu_);  // a zombie is refused before it spends a verify
    RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), job, epoch));
  }
  // The FULLs kept are verified outside the lock: a verify reads whole checkpoints.
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> listed,
                   ListCheckpoints(job, /*include_pending=*/false));
  ASSIGN_OR_RETURN(std::vector<int64_t> doomed,
                   FullsOutsidePolicy(job, listed, policy,
                                      [&](int64_t step) { return Verify(job, step); }));
  return GcSteps(job, doomed, epoch);
}

absl::StatusOr<GcResult> EngineImpl::GcSteps(const std::string& job,
                                             const std::vector<int64_t>& fulls, uint64_t epoch) {
  RETURN_IF_ERROR(CheckJobChange(job));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), job, epoch));
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(CheckpointPrefix(job)));
  std::vector<CheckpointRecord> all;
  for (const auto& [k, v] : kvs) {
    CheckpointRecord r;
    RETURN_IF_ERROR(DecodeCheckpoint(v, &r));
    all.push_back(std::move(r));
  }
  const std::set<int64_t> asked(fulls.begin(), fulls.end());
  std::set<int64_t> doomed_fulls;  // those this node holds committed; the others are skipped
  for (const CheckpointRecord& r : all) {
    if (asked.count(r.spec.step) == 0) continue;
    if (r.spec.kind != CheckpointKind::kFull) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gc: job ", job, " step ", r.spec.step,
          " is a DELTA: gc deletes FULLs, each with its DELTAs (nothing deleted)"));
    }
    if (r.state == CheckpointState::kCommitted) doomed_fulls.insert(r.spec.step);
  }
  RETURN_IF_ERROR(PurgeQuarantine(fs_, options_.data_dir, options_.quarantine_grace_seconds,
                                  options_.clock->NowUnixMillis())
                      .status());
  GcResult result;
  // DELTAs of a doomed FULL go first, then the FULL itself.
  for (const CheckpointRecord& r : all) {
    if (r.spec.kind == CheckpointKind::kDelta && doomed_fulls.count(r.spec.base_step) != 0) {
      RETURN_IF_ERROR(DeleteLocked(job, r.spec.step, &result.bytes_reclaimed));
      result.deleted_steps.push_back(r.spec.step);
    }
  }
  for (int64_t step : doomed_fulls) {
    RETURN_IF_ERROR(DeleteLocked(job, step, &result.bytes_reclaimed));
    result.deleted_steps.push_back(step);
  }
  std::sort(result.deleted_steps.begin(), result.deleted_steps.end());
  return result;
}

}  // namespace storage
}  // namespace gradsnap
