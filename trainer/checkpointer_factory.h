// Makes the Checkpointer for --ckpt-mode. The snapshot engineer extends MakeCheckpointer with
// the async and gockpt modes (gpu_snapshot/); the trainer only calls this function.
#ifndef GRADSNAP_TRAINER_CHECKPOINTER_FACTORY_H_
#define GRADSNAP_TRAINER_CHECKPOINTER_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/checkpointer.h"
#include "trainer/shard_store.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

// The modes this build knows how to parse, available or not.
std::vector<std::string> CheckpointModeNames();
// INVALID_ARGUMENT for an unknown mode; UNIMPLEMENTED ("not available in this build") for a
// known mode not built yet. `store` may be null only for mode "none"; it must outlive the
// checkpointer. `view` stays valid for the run.
absl::StatusOr<std::unique_ptr<Checkpointer>> MakeCheckpointer(const CheckpointerOptions& options,
                                                               const TrainStateView& view,
                                                               ShardStore* store);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CHECKPOINTER_FACTORY_H_
