// The gradient log in the store (docs/gockpt.md): DELTA shards on top of FULL checkpoints, how
// to save one, and how a resume replays them.
//
// A DELTA checkpoint of step u (CheckpointKind::kDelta, base_step = F) holds per rank the
// tensors "delta_header" (gpu_snapshot/grad_log.h), "grad" (f32 or bf16, flat slice of the
// logical buffer "grad") and "replicated_state"; the checkpoint and shard metadata carry the
// serialized ReplicatedState after step u, like a FULL. The recovery point of a job is its
// newest committed FULL F plus the longest run of committed DELTAs F+1, F+2, ... with base F.
//
// Thread safety: free functions. The store calls are collective (shard_store.h).
#ifndef GRADSNAP_TRAINER_GRAD_LOG_STORE_H_
#define GRADSNAP_TRAINER_GRAD_LOG_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "trainer/shard_store.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

inline constexpr const char* kDeltaHeaderTensor = "delta_header";
inline constexpr const char* kDeltaGradTensor = "grad";

// The newest FULL with step <= max_step (any when max_step < 0) and its chain of DELTAs.
struct RecoveryPoint {
  int64_t full_step = -1;
  std::vector<int64_t> delta_steps;  // full_step + 1, full_step + 2, ... contiguous
  int64_t step() const { return delta_steps.empty() ? full_step : delta_steps.back(); }
};
RecoveryPoint FindRecoveryPoint(const std::vector<client::CheckpointInfo>& committed,
                                int64_t max_step = -1);

// Saves one rank's DELTA shard, blocking until durable. Collective.
absl::Status SaveDeltaShard(ShardStore& store, const std::string& job, const TrainStateView& view,
                            const gpu_snapshot::DeltaRecord& record);

// After FULL `full_step` was restored into host buffers master/m/v (view.count() each), replays
// the committed DELTA chain on it and returns the replicated state of the last step replayed
// (`restored` when there is no chain). Collective.
absl::StatusOr<ReplicatedState> ReplayGradLog(ShardStore& store, const std::string& job,
                                              int64_t full_step, const TrainStateView& view,
                                              float* master, float* m, float* v,
                                              const ReplicatedState& restored);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_GRAD_LOG_STORE_H_
