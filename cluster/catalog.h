// ClusterCatalog: the checkpoint catalog and the job epochs of cluster mode, in etcd
// (docs/protocol.md "Cluster mode", docs/format.md "Cluster records"). Tensor manifests stay on
// the storage nodes (shard footers and node catalogs); etcd holds one small record per
// checkpoint and one epoch per job:
//
//   /gradsnap/epochs/<job>                 the job's newest writer epoch (decimal)
//   /gradsnap/ckpt/<job>/<step, 20 digits> the checkpoint's record: PENDING, then COMMITTED
//                                          with every rank's size, digest and replica node ids
//   /gradsnap/staged/<job>/<step>/<rank>   a rank whose copies are durable, until the commit
//
// A checkpoint is listed iff its record is COMMITTED. Every write is one etcd transaction that
// compares the job's epoch with the writer's (when the writer has one: epoch 0 is unfenced), so
// a zombie of an older attempt can begin, stage and commit nothing once a newer attempt took
// its epoch. The commit is one transaction: the epoch compare, the record unchanged since it was
// read (and, for a DELTA, its FULL still COMMITTED), then the record put COMMITTED with all
// ranks and the staged keys deleted. Of two writers committing the same checkpoint exactly one
// wins; the other gets ALREADY_EXISTS, a retry by the winner OK.
//
// Error codes: FAILED_PRECONDITION "superseded by attempt N" (fenced), a DELTA without its
// FULL, ranks missing; ALREADY_EXISTS another spec or another writer's commit; NOT_FOUND no
// such checkpoint; UNAVAILABLE etcd unreachable or without quorum (EtcdClient); ABORTED when
// the record kept changing under a commit (8 tries).
//
// THREAD SAFETY: all methods may be called from any thread.
#ifndef GRADSNAP_CLUSTER_CATALOG_H_
#define GRADSNAP_CLUSTER_CATALOG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/etcd_client.h"
#include "common/local_job.h"
#include "gradsnap/types.h"

namespace gradsnap {
namespace cluster {

// Where one rank's shard is: its payload size, its digest (opaque, no spaces) and the ids of
// the nodes holding a durable copy, in placement order.
struct RankReplicas {
  uint64_t raw_bytes = 0;
  std::string digest;
  std::vector<std::string> nodes;
  bool operator==(const RankReplicas&) const = default;
};

struct ClusterCheckpoint {
  std::string job;
  int64_t step = 0;
  storage::CheckpointKind kind = storage::CheckpointKind::kFull;
  int64_t base_step = -1;
  int32_t world_size = 1;
  uint64_t epoch = 0;  // of the writer that began it
  storage::CheckpointState state = storage::CheckpointState::kPending;
  int64_t created_unix_ms = 0;
  int64_t committed_unix_ms = 0;
  std::string committed_by;                 // the committing catalog's writer id
  // Copies of each rank the writer asked for (ClientOptions::cluster_replicas), the count the
  // repair worker restores; 0 in records written before the field: each rank's node count.
  int32_t replicas = 0;
  std::map<int32_t, RankReplicas> ranks;    // COMMITTED: every rank
  int64_t mod_revision = 0;                 // of the record in etcd
};

// The key of (job, step)'s record, and the prefix of every record.
inline constexpr char kCheckpointsPrefix[] = "/gradsnap/ckpt/";
std::string CheckpointRecordKey(const std::string& job, int64_t step);

// The record's text (docs/format.md) and back; DATA_LOSS for a record that does not parse.
std::string EncodeCheckpointRecord(const ClusterCheckpoint& c);
absl::StatusOr<ClusterCheckpoint> DecodeCheckpointRecord(const std::string& job, int64_t step,
                                                         const std::string& text);

// A record read under kCheckpointsPrefix (its key names the job and step), mod_revision set:
// INVALID_ARGUMENT for a key of another shape, DATA_LOSS for a record that does not parse.
absl::StatusOr<ClusterCheckpoint> DecodeCheckpointKv(const EtcdKv& kv);

// The copies of a rank that repair restores: the record's `replicas` (the rank's node count in
// records without it), at most the `live_nodes`.
inline size_t WantedCopies(const ClusterCheckpoint& c, const RankReplicas& r, size_t live_nodes) {
  const size_t want = c.replicas > 0 ? static_cast<size_t>(c.replicas) : r.nodes.size();
  return want < live_nodes ? want : live_nodes;
}

class ClusterCatalog {
 public:
  // Borrows `etcd`; the catalog's writer id is random.
  explicit ClusterCatalog(EtcdClient* etcd);

  // A new epoch for `job`: one more than its newest and at least the wall clock in ms (as the
  // node engine's, storage/epoch.h). Every older epoch is fenced from now on.
  absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job);
  // The job's newest epoch (0: none yet).
  absl::StatusOr<uint64_t> CurrentEpoch(const std::string& job);

  // Creates the PENDING record (idempotent for the same spec). A DELTA needs its FULL's record.
  // `replicas`: the copies per rank the writer places (kept in the record for repair).
  absl::Status Begin(const storage::CheckpointSpec& spec, int32_t replicas = 0);
  // Records that rank `rank` of (job, step) is durable on `replicas.nodes` (a later call for the
  // same rank replaces it) while the record is PENDING.
  absl::Status StageRank(const std::string& job, int64_t step, int32_t rank, uint64_t epoch,
                         const RankReplicas& replicas);
  // Commits (job, step) once every rank is staged (and, for a DELTA, its FULL is COMMITTED).
  absl::Status Commit(const std::string& job, int64_t step, uint64_t epoch);
  // Removes a PENDING record and its staged ranks; FAILED_PRECONDITION for a COMMITTED one.
  absl::Status Abort(const std::string& job, int64_t step, uint64_t epoch);
  // Removes a record (the nodes drop the data afterwards); FAILED_PRECONDITION for a FULL that
  // a DELTA's record names as its base.
  absl::Status Delete(const std::string& job, int64_t step, uint64_t epoch);

  // Replaces rank `rank`'s replica nodes of the COMMITTED record `c`, as read (c.mod_revision),
  // in one transaction that also requires `guard` when given (the repairer's leadership key).
  // ABORTED when the record changed since it was read (deleted, rewritten, another update) or
  // the guard failed: the caller re-reads.
  absl::Status SetReplicas(const ClusterCheckpoint& c, int32_t rank,
                           const std::vector<std::string>& nodes,
                           const etcdserverpb::Compare* guard);

  absl::StatusOr<ClusterCheckpoint> Get(const std::string& job, int64_t step);
  // By ascending step; COMMITTED ones only unless include_pending.
  absl::StatusOr<std::vector<ClusterCheckpoint>> List(const std::string& job,
                                                      bool include_pending = false);

  const std::string& writer_id() const { return writer_id_; }

 private:
  // FAILED_PRECONDITION "superseded" when `epoch` is not the job's newest (0: never).
  absl::Status CheckEpoch(const std::string& job, uint64_t epoch);
  // One transaction: the record (if still at `mod_revision`) and its staged ranks deleted,
  // fenced by `epoch`; `what` ("aborted") names the operation in errors.
  absl::Status RemoveRecord(const std::string& job, int64_t step, uint64_t epoch,
                            int64_t mod_revision, const char* what);
  // The record with, while PENDING, its staged ranks in `ranks` (one consistent read).
  absl::StatusOr<ClusterCheckpoint> WithStaged(const std::string& job, int64_t step);

  EtcdClient* const etcd_;
  const std::string writer_id_;
  // Begin's memory of the FULL records that DELTAs were begun on: (job, step) -> the record's
  // mod revision when it was read and found a FULL. A DELTA's Begin compares it in its
  // transaction instead of reading the FULL first; a record changed since (repaired, deleted)
  // fails that compare, and Begin reads it again. Bounded (kBasesMax, oldest steps dropped).
  static constexpr size_t kBasesMax = 1024;
  absl::Mutex bases_mu_;
  std::map<std::pair<std::string, int64_t>, int64_t> bases_ ABSL_GUARDED_BY(bases_mu_);
};

}  // namespace cluster
}  // namespace gradsnap

#endif  // GRADSNAP_CLUSTER_CATALOG_H_
