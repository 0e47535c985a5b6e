// The FULL shard of a rank (format in trainer/checkpointer.h and docs/trainer.md): building its
// specs for saving, and restoring it into a rank's state. Shared by every checkpoint mode.
// Thread safety: free functions over caller memory.
#ifndef GRADSNAP_TRAINER_FULL_SHARD_H_
#define GRADSNAP_TRAINER_FULL_SHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "trainer/shard_store.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

// A FULL shard ready for ShardStore::BeginCheckpoint + SaveShard. The TensorRefs point into
// the host buffers passed to BuildFullShard and into `replicated` (owned here): keep this
// object and those buffers alive until SaveShard returns.
struct FullShard {
  client::CheckpointSpec checkpoint;
  client::ShardSpec shard;
  std::vector<client::TensorRef> tensors;
  std::string replicated;
};

// `view` gives rank, world size and slice; master/m/v are HOST copies of its slice (may be the
// view's own pointers on the CPU back end). `step` is the completed step the state belongs to.
FullShard BuildFullShard(const std::string& job, int64_t step, const TrainStateView& view,
                         const float* master, const float* m, const float* v,
                         const ReplicatedState& state);

// Saves one FULL shard, blocking until durable. Collective (see ShardStore).
absl::Status SaveFullShard(ShardStore& store, const std::string& job, int64_t step,
                           const TrainStateView& view, const float* master, const float* m,
                           const float* v, const ReplicatedState& state);

// Which checkpoint --resume picks: "none" -> -1, "latest" -> newest committed FULL (or -1 if
// there is none), "STEP" -> that step (NOT_FOUND if it is not committed). Collective.
absl::StatusOr<int64_t> ResolveResumeStep(ShardStore& store, const std::string& job,
                                          const std::string& resume);

// The replicated state of committed checkpoint `step` (from the checkpoint's metadata), to check
// a resume is compatible before reading any tensor. Collective.
absl::StatusOr<ReplicatedState> ReadCheckpointState(ShardStore& store, const std::string& job,
                                                    int64_t step);

// Restores this rank's FULL shard of `step` into HOST buffers master/m/v (view.count() each)
// and returns its replicated state. FAILED_PRECONDITION when the checkpoint's world size, slice
// or flat size differ from `view`. Collective.
absl::StatusOr<ReplicatedState> RestoreFullShard(ShardStore& store, const std::string& job,
                                                 int64_t step, const TrainStateView& view,
                                                 float* master, float* m, float* v);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_FULL_SHARD_H_
