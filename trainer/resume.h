// Where a rank's state comes from when a run does not start fresh (docs/trainer.md, "Resume"):
// the job's recovery point in the store (--resume latest), a given step (--resume STEP), or a
// directory written by `gradsnap restore` (--init-from DIR). Any of them may have been written
// with another number of ranks: every rank restores exactly its own slice [lo, hi) with ranged
// reads (recovery/restore_state.h), so resharding is exact.
//
// OVERVIEW
//   Direct store (--storage, or a single rank): every rank reads its own slice at once; for
//   `latest` the ranks agree on the recovery point with an all-reduce: a FULL that any rank
//   found damaged is dropped for the previous one, and the chain is cut at the shortest prefix
//   every rank could replay (a rank that got further restores again up to it).
//   Embedded store with several ranks (only rank 0 may open the engine): rank 0 restores the
//   whole state and sends each rank its slice over the training communicator.
//
// THREAD SAFETY
//   Called once per rank from the training thread; collective over `comm`.
#ifndef GRADSNAP_TRAINER_RESUME_H_
#define GRADSNAP_TRAINER_RESUME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/comm.h"
#include "trainer/shard_store.h"
#include "trainer/train_state.h"
#include "trainer/trainer.h"

namespace gradsnap {
namespace trainer {

struct ResumeOutcome {
  bool resumed = false;             // false: no checkpoint to resume from, start fresh
  ReplicatedState state;            // the restored replicated state, adopted for this run
  int64_t full_step = -1;           // the FULL it came from
  int deltas = 0;                   // DELTAs replayed on it
  int32_t saved_world_size = 0;     // ranks of the run that wrote it
  int64_t newest_step = -1;         // the newest recovery point before any fallback
  std::vector<std::string> damage;  // damaged records this rank saw (job, step, rank, tensor)
  double list_ms = 0;  // this rank's listing of the job's checkpoints (rank 0's goes in the line)
  double fetch_ms = 0;
  double replay_ms = 0;
  std::string source;  // "job J" or "directory D"
};

// A checkpoint may continue only a run of the same model, sequence length and data; its
// global batch too, unless allow_batch_change. The world size may differ (resharding).
absl::Status CheckCompatible(const ReplicatedState& ckpt, const ReplicatedState& run,
                             bool allow_batch_change);

// The checks that refuse a launch, done by rank 0 alone through its own client before the
// launch takes a writer epoch (taking one fences out the job's running attempt, so a launch that
// is then refused must not have taken it): a fresh run (--resume none) of a job that already
// has checkpoints; a --resume whose checkpoint does not fit this run (model, sequence length,
// data, batch). Reads only; not collective. OK where nothing is to be checked here (the
// restore itself reports a missing or damaged checkpoint).
// FAILED_PRECONDITION for a fresh run (--resume none) of a job whose checkpoints `committed`
// (oldest first) lists; OK when it lists none.
absl::Status RefuseFreshRunOfExistingJob(const std::string& job,
                                         const std::vector<storage::CheckpointInfo>& committed);

absl::Status CheckBeforeFencing(const TrainOptions& o, ShardStore* store,
                                const TrainStateView& view, const ReplicatedState& run);

// Restores this rank's slice (view.lo..view.hi) into host buffers master/m/v (view.count()
// each), from the store (`store`, when o.resume is not none) or from o.init_from. `run` is the
// fresh state of this run, for the compatibility check. Collective over `comm`.
absl::StatusOr<ResumeOutcome> RestoreRankState(const TrainOptions& o, ShardStore* store, Comm& comm,
                                               const TrainStateView& view,
                                               const ReplicatedState& run, float* master, float* m,
                                               float* v);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_RESUME_H_
