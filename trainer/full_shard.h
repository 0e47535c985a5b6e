// The FULL shard of a rank (format in trainer/checkpointer.h and docs/trainer.md): building its
// specs and saving it. Shared by every checkpoint mode; restoring is trainer/resume.h.
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

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_FULL_SHARD_H_
