// MakeCheckpointer: the one place that maps --ckpt-mode to an implementation.
#include "trainer/checkpointer_factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "gpu_snapshot/trace.h"
#include "trainer/snapshot_checkpointer.h"
#include "trainer/sync_checkpointer.h"

namespace gradsnap {
namespace trainer {

std::vector<std::string> CheckpointModeNames() { return {"none", "sync", "async", "gockpt"}; }

namespace {

absl::StatusOr<std::unique_ptr<Checkpointer>> MakeUntraced(const CheckpointerOptions& options,
                                                           const TrainStateView& view,
                                                           ShardStore* store,
                                                           gpu_snapshot::TraceWriter* trace) {
  // The snapshot engine (gpu_snapshot/) runs async, gockpt, every mode with --grad_log, and
  // sync on a device (CUDA, sim), whose stop-the-world copy then goes into pinned staging like
  // every other mode's (a fair baseline).
  const bool engine = options.mode == "async" || options.mode == "gockpt" ||
                      (options.mode == "sync" && view.on_device) ||
                      (options.grad_log && (options.mode == "none" || options.mode == "sync"));
  if (engine) {
    if (store == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--ckpt_mode ", options.mode, options.grad_log ? " --grad_log" : "",
          " needs a store (--ckpt_dir or --storage)"));
    }
    return NewSnapshotCheckpointer(options, view, store, trace);
  }
  if (options.mode == "none") return NewNoneCheckpointer();
  if (options.mode == "sync" || options.mode == "async" || options.mode == "gockpt") {
    if (store == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--ckpt-mode ", options.mode, " needs a store (--ckpt-dir or --storage)"));
    }
  }
  if (options.mode == "sync") return NewSyncCheckpointer(options, view, store);
  return absl::InvalidArgumentError(absl::StrCat("unknown --ckpt-mode '", options.mode,
                                                 "' (known: ",
                                                 absl::StrJoin(CheckpointModeNames(), ", "), ")"));
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
