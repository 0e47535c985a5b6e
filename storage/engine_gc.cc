// EngineImpl, removal: Delete (refused for a checkpoint a DELTA still replays on) and Gc (the
// FULLs kept by keep_last and keep_every, the rest deleted with their DELTAs, and the
// quarantine purged of what outlived its grace).
//
// LOCKING: mu_ guards the catalog's read-modify-write. Delete takes it; DeleteLocked requires
// it and takes the leaf writers_mu_ to refuse a checkpoint with an open writer. Gc verifies
// the FULLs it keeps outside mu_ (a verify reads whole checkpoints), then takes it to decide
// and delete.
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
#include "storage/quarantine.h"
#include "storage/rebuild.h"

namespace gradsnap {
namespace storage {

absl::Status EngineImpl::DeleteLocked(const std::string& job, int64_t step, uint64_t* reclaimed) {
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
  // Marked first (storage/rebuild.h): a rebuild after a kill past the commit below must not
  // bring the checkpoint back. Best effort: a disk too full for an empty file still deletes.
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
  const MetaStore::Batch b = MetaStore::DeleteCheckpointBatch(job, step);
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  RETURN_IF_ERROR(meta_->Commit(b));
  // Metadata is gone: the files are now orphans, which recovery would also remove.
  return fs_->RemoveAll(CheckpointDir(job, step));
}

absl::Status EngineImpl::Delete(const std::string& job, int64_t step) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  RETURN_IF_ERROR(CheckWritable());
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
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
  uint64_t reclaimed = 0;
  return DeleteLocked(job, step, &reclaimed);
}

absl::StatusOr<GcResult> EngineImpl::Gc(const std::string& job, const GcPolicy& policy) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  if (policy.keep_last < 0 || policy.keep_every < 0) {
    return absl::InvalidArgumentError("keep_last and keep_every must be >= 0");
  }
  RETURN_IF_ERROR(CheckWritable());
  // The FULLs kept: from the newest down, until keep_last of them verify (every chunk checksum
  // and tensor digest read back). A damaged one is kept but not counted, so gc never deletes
  // the checkpoint a restore of `latest` falls back to (nothing deleted by guesswork). Read
  // outside the lock: a verify reads whole checkpoints.
  int64_t keep_from = INT64_MIN;  // FULLs below this step may go
  if (policy.keep_last > 0) {
    ASSIGN_OR_RETURN(std::vector<CheckpointInfo> listed, ListCheckpoints(job, /*include_pending=*/false));
    int verified = 0;
    for (auto it = listed.rbegin(); it != listed.rend() && verified < policy.keep_last; ++it) {
      if (it->kind != CheckpointKind::kFull) continue;
      keep_from = it->step;
      absl::Status v = Verify(job, it->step);
      if (v.ok()) {
        ++verified;
      } else if (absl::IsDataLoss(v)) {
        GS_LOG(WARNING) << "gc: job " << job << " FULL " << it->step
                        << " does not verify; kept, not counted toward keep_last: " << v.message();
      } else {
        return v;  // cannot tell: delete nothing
      }
    }
    if (verified < policy.keep_last) keep_from = INT64_MIN;  // too few good FULLs: keep all
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(PurgeQuarantine(fs_, options_.data_dir, options_.quarantine_grace_seconds,
                                  options_.clock->NowUnixMillis())
                      .status());
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(CheckpointPrefix(job)));
  std::vector<CheckpointRecord> all;
  for (const auto& [k, v] : kvs) {
    CheckpointRecord r;
    RETURN_IF_ERROR(DecodeCheckpoint(v, &r));
    all.push_back(std::move(r));
  }
  std::vector<int64_t> fulls;  // committed, ascending
  for (const CheckpointRecord& r : all) {
    if (r.spec.kind == CheckpointKind::kFull && r.state == CheckpointState::kCommitted) {
      fulls.push_back(r.spec.step);
    }
  }
  std::set<int64_t> doomed_fulls;
  for (size_t i = 0; i < fulls.size(); ++i) {
    const int64_t step = fulls[i];
    if (step >= keep_from) break;
    // keep_every K keeps, for every multiple of K, the newest FULL at or before it (the FULL
    // a restore of that step starts from): FULLs on multiples of K where they are there, and
    // one FULL per K steps where they are not (gockpt's FULLs end their window after it).
    if (policy.keep_every > 0 && i + 1 < fulls.size()) {
      const int64_t k = policy.keep_every;
      const int64_t to_multiple = (k - step % k) % k;
      if (to_multiple < fulls[i + 1] - step) continue;  // a multiple in [step, next FULL)
    }
    doomed_fulls.insert(step);
  }
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
