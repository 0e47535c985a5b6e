// MakeCheckpointer: the one place that maps --ckpt-mode to an implementation.
#include "trainer/checkpointer_factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainer/sync_checkpointer.h"

namespace gradsnap {
namespace trainer {

std::vector<std::string> CheckpointModeNames() { return {"none", "sync", "async", "gockpt"}; }

absl::StatusOr<std::unique_ptr<Checkpointer>> MakeCheckpointer(const CheckpointerOptions& options,
                                                               const TrainStateView& view,
                                                               ShardStore* store) {
  if (options.mode == "none") return NewNoneCheckpointer();
  if (options.mode == "sync" || options.mode == "async" || options.mode == "gockpt") {
    if (store == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--ckpt-mode ", options.mode, " needs a store (--ckpt-dir or --storage)"));
    }
  }
  if (options.mode == "sync") return NewSyncCheckpointer(options, view, store);
  if (options.mode == "async" || options.mode == "gockpt") {
    return absl::UnimplementedError(
        absl::StrCat("--ckpt-mode ", options.mode, " is not available in this build"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown --ckpt-mode '", options.mode,
                                                 "' (known: ",
                                                 absl::StrJoin(CheckpointModeNames(), ", "), ")"));
}

}  // namespace trainer
}  // namespace gradsnap
