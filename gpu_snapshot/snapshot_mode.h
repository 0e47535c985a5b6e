// How a rank's training state is checkpointed (docs/gockpt.md): the one enum the trainer's
// --ckpt_mode, its CheckpointerOptions and the snapshot engine share. Strings exist only at the
// flag boundary (ParseSnapshotMode) and in output (SnapshotModeName).
#ifndef GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_
#define GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {
namespace gpu_snapshot {

enum class SnapshotMode { kNone, kSync, kAsync, kGoCkpt };

// "none", "sync", "async" or "gockpt".
const char* SnapshotModeName(SnapshotMode m);
// The inverse of SnapshotModeName; INVALID_ARGUMENT "unknown --ckpt_mode 'NAME' (known: none,
// sync, async, gockpt)" for any other string.
absl::StatusOr<SnapshotMode> ParseSnapshotMode(absl::string_view name);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_
