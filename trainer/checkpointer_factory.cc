// MakeCheckpointer: the one place that maps --ckpt-mode to an implementation.
#include "trainer/checkpointer_factory.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_snapshot/trace.h"
#include "trainer/snapshot_checkpointer.h"
#include "trainer/sync_checkpointer.h"

namespace gradsnap {
namespace trainer {

using gpu_snapshot::SnapshotMode;
using gpu_snapshot::SnapshotModeName;

namespace {

absl::StatusOr<std::unique_ptr<Checkpointer>> MakeUntraced(const CheckpointerOptions& options,
                                                           const TrainStateView& view,
                                                           ShardStore* store,
                                                           gpu_snapshot::TraceWriter* trace) {
  const SnapshotMode mode = options.mode;
  if (!options.writes()) return NewNoneCheckpointer();
  if (store == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--ckpt_mode ", SnapshotModeName(mode), options.grad_log ? " --grad_log" : "",
        " needs a store (--ckpt_dir or --storage)"));
  }
  // The snapshot engine (gpu_snapshot/) runs async, gockpt, every mode with --grad_log, and
  // sync on a device (CUDA, sim), whose stop-the-world copy then goes into pinned staging like
  // every other mode's (a fair baseline).
  if (mode == SnapshotMode::kSync && !view.on_device && !options.grad_log) {
    return NewSyncCheckpointer(options, view, store);
  }
  return NewSnapshotCheckpointer(options, view, store, trace);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpointer>> MakeCheckpointer(const CheckpointerOptions& options,
                                                               const TrainStateView& view,
                                                               ShardStore* store) {
  if (options.trace_file.empty()) return MakeUntraced(options, view, store, nullptr);
  auto trace = std::make_unique<gpu_snapshot::TraceWriter>(
      view.rank == 0 ? options.trace_file : absl::StrCat(options.trace_file, ".rank", view.rank));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> inner,
                   MakeUntraced(options, view, store, trace.get()));
  return NewTracingCheckpointer(std::move(inner), std::move(trace));
}

}  // namespace trainer
}  // namespace gradsnap
