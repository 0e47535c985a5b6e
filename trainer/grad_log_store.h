// The gradient log in the store (docs/gockpt.md): DELTA shards on top of FULL checkpoints, how
// to save one, and how a resume replays them.
//
// A DELTA checkpoint of step u (CheckpointKind::kDelta, base_step = F) holds per rank the
// tensors "delta_header" (gpu_snapshot/grad_log.h), "grad" (f32 or bf16, flat slice of the
// logical buffer "grad") and "replicated_state"; the checkpoint and shard metadata carry the
// serialized ReplicatedState after step u, like a FULL. Resuming reads them back through the
// recovery library (trainer/resume.h, recovery/restore_state.h).
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
#include "recovery/recovery_point.h"
#include "recovery/state_source.h"
#include "trainer/shard_store.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

inline constexpr const char* kDeltaHeaderTensor = recovery::kDeltaHeaderTensor;
inline constexpr const char* kDeltaGradTensor = recovery::kFlatGrad;

// The recovery point (recovery/recovery_point.h): the newest FULL and its DELTA chain.
using recovery::FindRecoveryPoint;
using recovery::RecoveryPoint;

// Saves one rank's DELTA shard, blocking until durable. Collective.
absl::Status SaveDeltaShard(ShardStore& store, const std::string& job, const TrainStateView& view,
                            const gpu_snapshot::DeltaRecord& record);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_GRAD_LOG_STORE_H_
