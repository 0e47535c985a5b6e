// The `none` and `sync` (stop-the-world FULL) checkpointers; see checkpointer.h.
#ifndef GRADSNAP_TRAINER_SYNC_CHECKPOINTER_H_
#define GRADSNAP_TRAINER_SYNC_CHECKPOINTER_H_

#include <memory>

#include "trainer/checkpointer.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace trainer {

std::unique_ptr<Checkpointer> NewNoneCheckpointer();
// `store` must outlive the checkpointer.
std::unique_ptr<Checkpointer> NewSyncCheckpointer(const CheckpointerOptions& options,
                                                  const TrainStateView& view, ShardStore* store);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_SYNC_CHECKPOINTER_H_
