// The failure policy of checkpoint persists (docs/trainer.md, "When checkpointing fails"):
// checkpointing failures degrade, never kill training.
//
// OVERVIEW
//   Every FULL or DELTA persist of a rank goes through PersistGuard::Persist, in the same order
//   on every rank. A persist that fails with a transient code (UNAVAILABLE, RESOURCE_EXHAUSTED,
//   ABORTED, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN) is retried with backoff (100 ms doubling to
//   1 s) until `persist_timeout_ms` after its start. Then the ranks agree on the outcome with a
//   small collective (ShardStore::AllAgree): the checkpoint counts as written only if it was
//   durable on every rank. A failure anywhere:
//     - counts one ckpt_failure (the same count on every rank);
//     - cuts the DELTA chain: a failed FULL F makes every DELTA on F skipped, a failed DELTA on
//       F every later DELTA on F, until the next FULL, so nothing committed has a hole and no
//       DELTA commits without its FULL;
//     - makes rank 0 roll back the checkpoint's PENDING shards (at once when the store answered
//       the failure, else after the next persist that succeeds).
//   The recovery point (newest checkpoint committed on every rank, FULL plus its chain) and its
//   age are tracked for the step lines.
//   Fatal instead of degraded: UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, a write
//   refused as superseded by a newer attempt (storage/epoch.h), and any failure with
//   --ckpt_on_failure stop. After a failure the ranks agree (a second small collective) whether
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
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "trainer/checkpointer.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace trainer {

// Failures that must stop the job at once (a restart cannot fix them).
bool IsPermanentStoreError(const absl::Status& s);

class PersistGuard {
 public:
  // `resumed_step`: the step the run restored (its recovery point), -1 for a fresh start.
  PersistGuard(ShardStore* store, const CheckpointerOptions& options, int rank,
               int64_t resumed_step);

  // Runs `work` (saves this rank's shard of checkpoint `step`; `base` is the FULL of a DELTA,
  // -1 for a FULL) under the policy above. OK: committed on every rank. CANCELLED: skipped
  // because its chain was cut (no store call, no collective). Otherwise the failure, counted.
  absl::Status Persist(client::CheckpointKind kind, int64_t step, int64_t base,
                       const std::function<absl::Status()>& work);

  // The training thread reports each finished step (for the recovery point's age).
  void NoteStepEnd(int64_t step);
  CheckpointHealth health() const;
  // The first fatal failure, OK if none.
  absl::Status fatal() const;

 private:
  absl::Status RunWithRetry(const std::function<absl::Status()>& work);
  void RollBack(int64_t step);
  void QueueRollBack(int64_t step);
  void RetryRollBacks();

  ShardStore* const store_;
  const CheckpointerOptions options_;
  const int rank_;

  // Persist thread only.
  std::map<int64_t, bool> cut_;          // FULL steps whose chain is cut
  std::vector<int64_t> pending_aborts_;  // rank 0: roll-backs that failed, retried later

  mutable absl::Mutex mu_;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t recovery_point_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<int64_t, int64_t> step_end_ms_ ABSL_GUARDED_BY(mu_);  // recent steps' end times
  int64_t recovery_ms_ ABSL_GUARDED_BY(mu_) = 0;                 // end time of recovery_point_
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_PERSIST_GUARD_H_
