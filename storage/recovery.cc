// EngineImpl::Recover: make the segment files agree with RocksDB, the source of truth.
//
// For every checkpoint directory: files of a shard that the shard record does not reference
// are moved to quarantine/ (never unlinked: the catalog may be the thing that is wrong),
// referenced files are truncated to their durable_end (dropping bytes written after the last
// synced metadata batch), and directories without a checkpoint record are quarantined too.
// A committed DELTA without a committed base FULL (stores written before DELTAs waited for
// their base) is reported, dropped from the catalog and its directory quarantined. PENDING
// checkpoints stay resumable; they are never listed as committed.
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/quarantine.h"

namespace gradsnap {
namespace storage {

absl::Status EngineImpl::RecoverCheckpoint(const CheckpointRecord& c) {
  const std::string dir = CheckpointDir(c.spec.job, c.spec.step);
  ASSIGN_OR_RETURN(auto shards, meta_->Scan(ShardPrefix(c.spec.job, c.spec.step)));
  std::map<std::string, uint64_t> keep;  // path -> durable end
  for (const auto& [k, v] : shards) {
    ShardRecord r;
    RETURN_IF_ERROR(DecodeShard(v, &r));
    for (const SegmentRef& s : r.segments) {
      keep[SegmentPath(c.spec.job, c.spec.step, r.spec.rank, s.seq)] = s.durable_end;
    }
  }
  auto names = fs_->ListDir(dir);
  if (absl::IsNotFound(names.status())) return absl::OkStatus();
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    std::string path = absl::StrCat(dir, "/", name);
    auto it = keep.find(path);
    if (it == keep.end()) {
      RETURN_IF_ERROR(QuarantinePath(fs_, options_.data_dir, path,
                                     "a segment file the catalog does not reference",
                                     options_.clock->NowUnixMillis()));
      continue;
    }
    OpenOptions oo;
    oo.write = true;
    ASSIGN_OR_RETURN(std::unique_ptr<File> f, fs_->Open(path, oo));
    ASSIGN_OR_RETURN(uint64_t size, f->Size());
    if (size > it->second) {
      GS_LOG(INFO) << "storage recovery: truncating " << path << " from " << size << " to "
                   << it->second;
      RETURN_IF_ERROR(f->Truncate(it->second));
      RETURN_IF_ERROR(f->Sync());
    }
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::RemoveOrphanDirs(const std::vector<CheckpointRecord>& checkpoints) {
  std::set<std::string> known;
  for (const CheckpointRecord& c : checkpoints) known.insert(CheckpointDir(c.spec.job, c.spec.step));
  const std::string root = options_.data_dir + "/segments";
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, fs_->ListDir(root));
  for (const std::string& job : jobs) {
    std::string jdir = absl::StrCat(root, "/", job);
    auto steps = fs_->ListDir(jdir);
    if (!steps.ok()) continue;
    for (const std::string& step : *steps) {
      const std::string dir = absl::StrCat(jdir, "/", step);
      if (known.count(dir) == 0) {
        RETURN_IF_ERROR(QuarantinePath(fs_, options_.data_dir, dir,
                                       "a checkpoint directory the catalog does not know",
                                       options_.clock->NowUnixMillis()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::RepairOrphanDeltas(std::vector<CheckpointRecord>* checkpoints) {
  std::map<std::pair<std::string, int64_t>, const CheckpointRecord*> all;
  for (const CheckpointRecord& c : *checkpoints) all[{c.spec.job, c.spec.step}] = &c;
  std::vector<CheckpointRecord> kept;
  for (const CheckpointRecord& c : *checkpoints) {
    bool orphan = false;
    if (c.spec.kind == CheckpointKind::kDelta && c.state == CheckpointState::kCommitted) {
      auto base = all.find({c.spec.job, c.spec.base_step});
      orphan = base == all.end() || base->second->spec.kind != CheckpointKind::kFull ||
               base->second->state != CheckpointState::kCommitted;
    }
    if (!orphan) {
      kept.push_back(c);
      continue;
    }
    GS_LOG(WARNING) << "storage recovery: committed DELTA job " << c.spec.job << " step "
                    << c.spec.step << " has no committed base FULL at step " << c.spec.base_step
                    << "; it cannot be replayed and is dropped from the catalog";
    MarkDeleted(c.spec.job, c.spec.step);
    RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
    RETURN_IF_ERROR(meta_->Commit(MetaStore::DeleteCheckpointBatch(c.spec.job, c.spec.step)));
    const std::string dir = CheckpointDir(c.spec.job, c.spec.step);
    auto names = fs_->ListDir(dir);
    if (names.ok()) {
      RETURN_IF_ERROR(QuarantinePath(fs_, options_.data_dir, dir,
                                     "a committed DELTA without its base FULL",
                                     options_.clock->NowUnixMillis()));
    }
  }
  *checkpoints = std::move(kept);
  return absl::OkStatus();
}

absl::Status EngineImpl::Recover() {
  // The one scan of the checkpoint records; each step below works from it.
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan("c/"));
  std::vector<CheckpointRecord> checkpoints(kvs.size());
  for (size_t i = 0; i < kvs.size(); ++i) {
    RETURN_IF_ERROR(Annotate(DecodeCheckpoint(kvs[i].second, &checkpoints[i]), kvs[i].first));
  }
  RETURN_IF_ERROR(RepairOrphanDeltas(&checkpoints));
  for (const CheckpointRecord& c : checkpoints) RETURN_IF_ERROR(RecoverCheckpoint(c));
  return RemoveOrphanDirs(checkpoints);
}

}  // namespace storage
}  // namespace gradsnap
