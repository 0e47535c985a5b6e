// The checkpointers built on the snapshot engine (gpu_snapshot/, docs/gockpt.md):
//   async   blocking device->host copy of the slice, background persist (CheckFreq style)
//   gockpt  GoCkpt multi-step overlapped copy + bit-exact host replay
//   and any mode with grad_log: a DELTA record per update on the latest FULL.
// Plus TracingCheckpointer, which wraps any checkpointer and writes --trace FILE.
// All modes persist through the same ShardStore path as `sync` (SaveFullShard).
//
// Thread safety: as Checkpointer (hooks on the training thread); the engine and the persist
// thread are internal.
#ifndef GRADSNAP_TRAINER_SNAPSHOT_CHECKPOINTER_H_
#define GRADSNAP_TRAINER_SNAPSHOT_CHECKPOINTER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu_snapshot/trace.h"
#include "trainer/checkpointer.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace trainer {

// `store` and `trace` (may be null) must outlive the checkpointer.
absl::StatusOr<std::unique_ptr<Checkpointer>> NewSnapshotCheckpointer(
    const CheckpointerOptions& options, const TrainStateView& view, ShardStore* store,
    gpu_snapshot::TraceWriter* trace);

// Records compute phases (between hooks) and the hooks' own time on the "train" track; owns the
// trace writer and flushes it at Finish and on destruction.
std::unique_ptr<Checkpointer> NewTracingCheckpointer(
    std::unique_ptr<Checkpointer> inner, std::unique_ptr<gpu_snapshot::TraceWriter> trace);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_SNAPSHOT_CHECKPOINTER_H_
