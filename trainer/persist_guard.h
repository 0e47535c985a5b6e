// The failure policy of checkpoint persists (docs/trainer.md, "When checkpointing fails"):
// checkpointing failures degrade, never kill training.
//
// OVERVIEW
//   Every FULL or DELTA persist of a rank goes through PersistGuard::Persist, in the same order
//   on every rank. Persists never hold training for the store (the snapshot checkpointer runs
//   them on its own thread, from a backlog in host memory: trainer/persist_backlog.h), and one
//   persist takes one try of the store however the store is doing: nothing is retried within
//   a persist (the store client's own few quick retries of one call aside), so a backlog drains
//   at the pace of the store's answers, not of timeouts. Each persist, in order:
//     1. A DELTA whose chain was cut (below) is skipped: no store call, no collective.
//     2. The ranks agree (ShardStore::AllAgree) whether to try it at all. It is tried only if
//        every rank holds its data (`have_data`: a rank whose backlog had no room kept none) and
//        the back-off after failures has passed on rank 0's clock (rank 0 alone votes on time,
//        so every rank takes the same decision). Otherwise it is skipped on every rank: counted
//        (CheckpointHealth::untried), its chain cut. Local memory and local timing decide only
//        through this agreement, so the ranks' collectives stay in step.
//     3. The save (`work`), once. Then the ranks agree on the outcome: the checkpoint counts as
//        written only if it was durable on every rank. A failure anywhere:
//        - counts one ckpt_failure (the same count on every rank);
//        - cuts the DELTA chain: a failed FULL F makes every DELTA on F skipped, a failed DELTA
//          on F every later DELTA on F, until the next FULL, so nothing committed has a hole
//          and no DELTA commits without its FULL;
//        - makes rank 0 roll back the checkpoint's PENDING shards (at once when the store
//          answered the failure, else after the next persist that succeeds);
//        - starts or lengthens the back-off: the next persist is tried no sooner than 100 ms
//          after the failure, doubling with every further failure up to `persist_timeout_ms`
//          (--ckpt-persist-timeout-ms); a full disk (RESOURCE_EXHAUSTED other than the
//          server's "server busy" backpressure, IsFullDisk) cannot heal by waiting a moment
//          and backs off the longest at once. A success ends the back-off.
//   The recovery point (newest checkpoint committed on every rank, FULL plus its chain) and its
//   age are tracked for the step lines.
//   Fatal instead of degraded: UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, a write
//   refused as superseded by a newer attempt (storage/epoch.h), and any failure with
//   --ckpt_on_failure stop. After a failure the ranks agree (a third small collective) whether
//   it is fatal anywhere; then fatal() holds the error on every rank (FAILED_PRECONDITION on the
//   ranks that only heard of it) and the checkpointer returns it.
//
// THREAD SAFETY
//   Persist runs on one thread at a time (the checkpointer's persist thread or the training
//   thread); health(), fatal() and NoteStepEnd may be called from any thread.
#ifndef GRADSNAP_TRAINER_PERSIST_GUARD_H_
#define GRADSNAP_TRAINER_PERSIST_GUARD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "common/clock.h"
#include "trainer/checkpointer.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace trainer {

// Failures that must stop the job at once (a restart cannot fix them).
bool IsPermanentStoreError(const absl::Status& s);
// The store is out of space (RESOURCE_EXHAUSTED that is not a "server busy" answer).
bool IsFullDisk(const absl::Status& s);

// The back-off after failed persists: the first wait, doubled per further failure.
constexpr int64_t kFirstBackoffMs = 100;

class PersistGuard {
 public:
  // `resumed_step`: the step the run restored (its recovery point), -1 for a fresh start.
  // `clock`: the back-off's and the recovery age's time (nullptr: the real clock).
  PersistGuard(ShardStore* store, const CheckpointerOptions& options, int rank,
               int64_t resumed_step, Clock* clock = nullptr);

  // Runs `work` (saves this rank's shard of checkpoint `step`; `base` is the FULL of a DELTA,
  // -1 for a FULL) under the policy above; `have_data` false: this rank kept no data for it
  // (`work` is not called). OK: committed on every rank. CANCELLED: skipped, on every rank
  // (its chain was cut: no store call, no collective; or not tried: a rank without its data,
  // or backing off). Otherwise the failure, counted.
  absl::Status Persist(client::CheckpointKind kind, int64_t step, int64_t base,
                       const std::function<absl::Status()>& work, bool have_data = true);

  // The training thread reports each finished step (for the recovery point's age).
  void NoteStepEnd(int64_t step);
  CheckpointHealth health() const;
  // The first fatal failure, OK if none.
  absl::Status fatal() const;

 private:
  // Step 2 above: whether every rank tries this persist.
  absl::StatusOr<bool> AgreeToTry(bool have_data);
  void NoteFailure(const absl::Status& s);
  int64_t NowMs() const { return clock_->NowMonotonicMillis(); }
  void RollBack(int64_t step);
  void QueueRollBack(int64_t step);
  void RetryRollBacks();

  ShardStore* const store_;
  const CheckpointerOptions options_;
  const int rank_;
  Clock* const clock_;

  // Persist thread only.
  std::map<int64_t, bool> cut_;          // FULL steps whose chain is cut
  std::vector<int64_t> pending_aborts_;  // rank 0: roll-backs that failed, retried later
  int64_t backoff_ms_ = 0;               // the current back-off; 0: none
  int64_t next_try_ms_ = 0;              // rank 0: no try before this time (NowMs)

  mutable absl::Mutex mu_;
  // The counts and the recovery point (recovery_age_s unused: health() computes it).
  CheckpointHealth health_ ABSL_GUARDED_BY(mu_);
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<int64_t, int64_t> step_end_ms_ ABSL_GUARDED_BY(mu_);  // recent steps' end times
  int64_t recovery_ms_ ABSL_GUARDED_BY(mu_) = 0;                 // end time of recovery_point_
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_PERSIST_GUARD_H_
