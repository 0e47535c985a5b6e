// Makes the Checkpointer for --ckpt-mode: none and sync here in trainer/, async, gockpt and
// --grad_log through the snapshot engine (gpu_snapshot/, trainer/snapshot_checkpointer.h). The
// trainer only calls this function.
#ifndef GRADSNAP_TRAINER_CHECKPOINTER_FACTORY_H_
#define GRADSNAP_TRAINER_CHECKPOINTER_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "trainer/checkpointer.h"
#include "trainer/shard_store.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

// FAILED_PRECONDITION when `store` is null for a mode that writes (every mode but kNone without
// grad_log). `store` must outlive the checkpointer. `view`
// stays valid for the run. With options.trace_file set, the checkpointer is wrapped so that it
// writes a trace there (rank r > 0 appends ".rank<r>").
absl::StatusOr<std::unique_ptr<Checkpointer>> MakeCheckpointer(const CheckpointerOptions& options,
                                                               const TrainStateView& view,
                                                               ShardStore* store);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CHECKPOINTER_FACTORY_H_
