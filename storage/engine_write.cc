// EngineImpl, shard writers: opening one (a reservation in active_writers_ and the shard
// record it resumes or starts anew), WriteShard over a writer, and what a shard saved again
// must show (ShardCommittedSize, SavedShardReadsBack). The writer itself is shard_writer.cc.
//
// LOCKING: mu_ guards the catalog's read-modify-write; writers_mu_ (a leaf, taken after mu_
// and never before it) guards active_writers_. ReserveWriterLocked requires mu_ and takes
// writers_mu_; HasWriter and ReleaseWriter take writers_mu_ only, so a writer's destructor
// never needs mu_. OpenShardWriter takes mu_ twice, reading a shard saved again back between
// (outside the lock: a whole shard). WriteShard, ShardCommittedSize and SavedShardReadsBack
// take no lock of their own.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/epoch.h"

namespace gradsnap {
namespace storage {

absl::StatusOr<std::unique_ptr<ShardWriter>> EngineImpl::OpenShardWriter(const ShardSpec& spec) {
  RETURN_IF_ERROR(ValidateName(spec.job, "job name"));
  RETURN_IF_ERROR(CheckWritable());
  // The same shard saved again (a run resumed from an older step persists the steps after it
  // once more; a retry after a lost answer) is a writer with nothing to do, but only if what
  // is stored still reads back: a damaged one must not be reported saved (the trainer would
  // count a recovery point it cannot restore). Read outside the lock: a whole shard.
  bool committed_same = false;
  {
    absl::MutexLock lock(&mu_);
    auto v = meta_->Get(ShardKey(spec.job, spec.step, spec.rank));
    ShardRecord old;
    committed_same = v.ok() && DecodeShard(*v, &old).ok() && old.committed &&
                     SameShardSpec(old.spec, spec);
  }
  if (committed_same) RETURN_IF_ERROR(SavedShardReadsBack(spec.job, spec.step, spec.rank));
  ShardRecord rec;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(rec, ReserveWriterLocked(spec));
  }
  // Outside mu_: a writer whose Init() fails is destroyed inside NewShardWriter, and its
  // destructor gives the reservation back through ReleaseWriter, which takes mu_.
  return NewShardWriter(this, std::move(rec));
}

absl::StatusOr<ShardRecord> EngineImpl::ReserveWriterLocked(const ShardSpec& spec) {
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), spec.job, spec.epoch));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(spec.job, spec.step));
  RETURN_IF_ERROR(ValidateShardSpec(spec, ckpt));
  std::string key = ShardKey(spec.job, spec.step, spec.rank);
  if (HasWriter(key)) {
    return absl::UnavailableError(absl::StrCat(Where(spec.job, spec.step, spec.rank),
                                               " is being written by another writer"));
  }
  ShardRecord rec;
  auto v = meta_->Get(key);
  bool fresh = absl::IsNotFound(v.status());
  if (!fresh) {
    if (!v.ok()) return v.status();
    RETURN_IF_ERROR(DecodeShard(*v, &rec));
    // Durable bytes of an older attempt are not this attempt's to resume (they may differ from
    // what it writes, its spec too): the shard starts over. Its old segment files are truncated
    // as the new writer reuses their numbers; any left over are unreferenced and quarantined at
    // an Open.
    if (!rec.committed && rec.committed_size > 0 && spec.epoch > rec.epoch) {
      GS_LOG(WARNING) << Where(spec.job, spec.step, spec.rank) << ": the " << rec.committed_size
                      << " durable bytes of attempt " << rec.epoch << " are dropped; attempt "
                      << spec.epoch << " writes the shard anew";
      fresh = true;
    }
  }
  if (!fresh) {
    if (!SameShardSpec(rec.spec, spec)) {
      if (rec.committed || rec.committed_size > 0) {
        return absl::AlreadyExistsError(absl::StrCat(
            Where(spec.job, spec.step, spec.rank), " exists with another spec"));
      }
      fresh = true;
    }
  }
  if (!fresh && rec.committed) {
    // Already committed with this spec: a writer with nothing left to do.
  } else if (ckpt.state == CheckpointState::kCommitted) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint job ", spec.job, " step ",
                                                 spec.step, " is already committed"));
  }
  if (fresh) {
    rec = ShardRecord();
    rec.spec = spec;
    rec.tensor_digests.resize(spec.tensors.size());
    rec.digest_algo = options_.digest;
    rec.epoch = spec.epoch;
    MetaStore::Batch b;
    b.puts.emplace_back(key, EncodeShard(rec));
    b.delete_prefixes.push_back(ChunkPrefix(spec.job, spec.step, spec.rank));
    RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
    RETURN_IF_ERROR(meta_->Commit(b));
  }
  absl::MutexLock lock(&writers_mu_);
  active_writers_.insert(key);
  rec.spec.epoch = spec.epoch;  // checked again when the writer commits
  rec.epoch = std::max(rec.epoch, spec.epoch);  // stored with the writer's next commit
  return rec;
}

bool EngineImpl::HasWriter(const std::string& key) {
  absl::MutexLock lock(&writers_mu_);
  return active_writers_.count(key) != 0;
}

// Called by a writer's destructor: takes only writers_mu_, never mu_, so a writer may be
// destroyed anywhere, even inside an engine critical section.
void EngineImpl::ReleaseWriter(const std::string& shard_key) {
  absl::MutexLock lock(&writers_mu_);
  active_writers_.erase(shard_key);
}

absl::Status EngineImpl::WriteShard(const ShardSpec& spec, const std::vector<const void*>& data) {
  if (data.size() != spec.tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteShard: ", data.size(),
                                                   " buffers for ", spec.tensors.size(),
                                                   " tensors"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> w, OpenShardWriter(spec));
  uint64_t pos = 0;
  uint64_t skip = w->committed_size();  // a resumed writer continues where it stopped
  for (size_t i = 0; i < data.size(); ++i) {
    uint64_t len = spec.tensors[i].byte_length;
    if (pos + len > skip) {
      uint64_t from = skip > pos ? skip - pos : 0;
      if (data[i] == nullptr && len > 0) return absl::InvalidArgumentError("null tensor data");
      RETURN_IF_ERROR(w->Append(static_cast<const uint8_t*>(data[i]) + from, len - from));
    }
    pos += len;
  }
  return w->Finish();
}

absl::StatusOr<uint64_t> EngineImpl::ShardCommittedSize(const std::string& job, int64_t step,
                                                        int32_t rank, uint64_t epoch) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  (void)ckpt;
  auto v = meta_->Get(ShardKey(job, step, rank));
  if (absl::IsNotFound(v.status())) return 0;
  if (!v.ok()) return v.status();
  ShardRecord r;
  RETURN_IF_ERROR(DecodeShard(*v, &r));
  // An older attempt's bytes: the asker's writer will start the shard over.
  if (!r.committed && epoch > r.epoch) return 0;
  // Asked about a committed shard, the client takes "complete" as saved (an idempotent save,
  // docs/protocol.md): only if what is stored reads back (OpenShardWriter's rule).
  if (r.committed) RETURN_IF_ERROR(SavedShardReadsBack(job, step, rank));
  return r.committed_size;
}

absl::Status EngineImpl::SavedShardReadsBack(const std::string& job, int64_t step,
                                             int32_t rank) {
  absl::Status readable = ReadBackShard(job, step, rank);
  if (!absl::IsDataLoss(readable)) return absl::OkStatus();  // other trouble: the save's own
  return absl::DataLossError(absl::StrCat(
      Where(job, step, rank), " is already saved, and what is stored does not read back (",
      readable.message(), "): delete the checkpoint (gradsnap rm) to save it again"));
}

}  // namespace storage
}  // namespace gradsnap
