// EngineImpl, the commit rules: a checkpoint begun (a DELTA needs its FULL and the DELTA before
// it in its chain), a shard's progress committed, a checkpoint committed when its last shard is
// (a DELTA only once its FULL is, and a FULL's commit promotes the DELTAs waiting on it), and a
// PENDING checkpoint aborted with the PENDING DELTAs on it.
//
// LOCKING: every function here reads, decides and commits under mu_ (the catalog's
// read-modify-write lock): BeginCheckpoint, CommitShardProgress and AbortCheckpoint take it;
// CommitCheckpointLocked requires it held. DeltasOf takes no lock (a scan); its callers here
// hold mu_ so what it returns stays true until they commit.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/epoch.h"

namespace gradsnap {
namespace storage {
namespace {

bool SameCheckpointSpec(const CheckpointSpec& a, const CheckpointSpec& b) {
  return a.job == b.job && a.step == b.step && a.kind == b.kind && a.base_step == b.base_step &&
         a.world_size == b.world_size && a.metadata == b.metadata;
}

}  // namespace

absl::Status EngineImpl::BeginCheckpoint(const CheckpointSpec& spec) {
  RETURN_IF_ERROR(ValidateCheckpointSpec(spec));
  RETURN_IF_ERROR(CheckWritable());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), spec.job, spec.epoch));
  auto existing = LoadCheckpoint(spec.job, spec.step);
  if (existing.ok()) {
    if (!SameCheckpointSpec(existing->spec, spec)) {
      return absl::AlreadyExistsError(absl::StrCat("checkpoint job ", spec.job, " step ",
                                                   spec.step, " exists with another spec"));
    }
    return absl::OkStatus();
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();
  if (spec.kind == CheckpointKind::kDelta) {
    auto base = LoadCheckpoint(spec.job, spec.base_step);
    if (!base.ok() || base->spec.kind != CheckpointKind::kFull) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DELTA step ", spec.step, " of job ", spec.job, " needs a FULL checkpoint at step ",
          spec.base_step));
    }
    // A DELTA replays on every DELTA of its chain before it, so the one before must be here
    // (pending or committed). Without this check, a DELTA deleted (`rm`) while its trainer
    // wrote on would leave every later DELTA of the chain listed as committed and none of
    // them restorable. Delete refuses the other order (a DELTA with later ones on its FULL).
    if (spec.step > spec.base_step + 1) {
      auto prev = LoadCheckpoint(spec.job, spec.step - 1);
      if (!prev.ok() && !absl::IsNotFound(prev.status())) return prev.status();
      if (!prev.ok() || prev->spec.kind != CheckpointKind::kDelta ||
          prev->spec.base_step != spec.base_step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DELTA step ", spec.step, " of job ", spec.job, " on FULL ", spec.base_step,
            " needs DELTA step ", spec.step - 1, " of its chain, which this store does not "
            "hold (deleted?): the chain is cut; the next FULL starts a new one"));
      }
    }
  }
  CheckpointRecord r;
  r.spec = spec;
  r.created_unix_ms = options_.clock->NowUnixMillis();
  MetaStore::Batch b;
  b.puts.emplace_back(CheckpointKey(spec.job, spec.step), EncodeCheckpoint(r));
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  return meta_->Commit(b);
}

absl::Status EngineImpl::CommitShardProgress(const ShardRecord& shard,
                                             const std::vector<ChunkRecord>& new_chunks,
                                             bool finish) {
  const ShardSpec& s = shard.spec;
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), s.job, s.epoch));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(s.job, s.step));
  MetaStore::Batch b;
  uint32_t idx = shard.chunk_count - static_cast<uint32_t>(new_chunks.size());
  for (const ChunkRecord& c : new_chunks) {
    b.puts.emplace_back(ChunkKey(s.job, s.step, s.rank, idx++), EncodeChunk(c));
  }
  b.puts.emplace_back(ShardKey(s.job, s.step, s.rank), EncodeShard(shard));
  if (finish) {
    // A shard is counted once, even if a second writer races to finish it.
    auto prev = meta_->Get(ShardKey(s.job, s.step, s.rank));
    if (!prev.ok() && !absl::IsNotFound(prev.status())) return prev.status();
    ShardRecord old;
    if (prev.ok() && DecodeShard(*prev, &old).ok() && old.committed) {
      return absl::OkStatus();
    }
    if (ckpt.state == CheckpointState::kCommitted) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", s.job, " step ",
                                                        s.step, " is already committed"));
    }
    ckpt.committed_shards += 1;
    ckpt.raw_bytes += shard.committed_size;
    ckpt.stored_bytes += shard.stored_bytes;
    if (ckpt.committed_shards == ckpt.spec.world_size) {
      RETURN_IF_ERROR(CommitCheckpointLocked(&ckpt, &b));
    }
    b.puts.emplace_back(CheckpointKey(s.job, s.step), EncodeCheckpoint(ckpt));
  }
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  return meta_->Commit(b);
}

absl::Status EngineImpl::CommitCheckpointLocked(CheckpointRecord* ckpt, MetaStore::Batch* b) {
  const std::string& job = ckpt->spec.job;
  if (ckpt->spec.kind == CheckpointKind::kDelta) {
    // A DELTA is committed only on top of a committed FULL; until then it waits, PENDING with
    // all its shards committed, and the base's commit promotes it.
    ASSIGN_OR_RETURN(CheckpointRecord base, LoadCheckpoint(job, ckpt->spec.base_step));
    if (base.state != CheckpointState::kCommitted) return absl::OkStatus();
    ckpt->state = CheckpointState::kCommitted;
    ckpt->committed_unix_ms = options_.clock->NowUnixMillis();
    return absl::OkStatus();
  }
  ckpt->state = CheckpointState::kCommitted;
  ckpt->committed_unix_ms = options_.clock->NowUnixMillis();
  ASSIGN_OR_RETURN(std::vector<CheckpointRecord> deltas, DeltasOf(job, ckpt->spec.step));
  for (CheckpointRecord& d : deltas) {
    if (d.state == CheckpointState::kPending && d.committed_shards == d.spec.world_size) {
      d.state = CheckpointState::kCommitted;
      d.committed_unix_ms = ckpt->committed_unix_ms;
      b->puts.emplace_back(CheckpointKey(job, d.spec.step), EncodeCheckpoint(d));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointRecord>> EngineImpl::DeltasOf(const std::string& job,
                                                                   int64_t full_step) {
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(CheckpointPrefix(job)));
  std::vector<CheckpointRecord> out;
  for (const auto& [k, v] : kvs) {
    CheckpointRecord r;
    RETURN_IF_ERROR(DecodeCheckpoint(v, &r));
    if (r.spec.kind == CheckpointKind::kDelta && r.spec.base_step == full_step) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

absl::StatusOr<CheckpointRecord> EngineImpl::LoadCheckpointToChangeLocked(
    const std::string& job, int64_t step, uint64_t epoch) {
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), job, epoch));
  return LoadCheckpoint(job, step);
}

absl::Status EngineImpl::AbortCheckpoint(const std::string& job, int64_t step, uint64_t epoch) {
  RETURN_IF_ERROR(CheckJobChange(job));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpointToChangeLocked(job, step, epoch));
  if (ckpt.state == CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", job, " step ", step,
                                                      " is committed; use Delete"));
  }
  std::vector<int64_t> deltas;  // PENDING DELTAs on this FULL go with it
  if (ckpt.spec.kind == CheckpointKind::kFull) {
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> on_it, DeltasOf(job, step));
    for (const CheckpointRecord& r : on_it) {
      if (r.state == CheckpointState::kCommitted) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint job ", job, " step ", step, " is the base of committed DELTA step ",
            r.spec.step));
      }
      deltas.push_back(r.spec.step);
    }
  }
  uint64_t reclaimed = 0;
  for (int64_t d : deltas) RETURN_IF_ERROR(DeleteLocked(job, d, &reclaimed));
  return DeleteLocked(job, step, &reclaimed);
}

}  // namespace storage
}  // namespace gradsnap
