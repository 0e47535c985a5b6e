// How a rank's training state is checkpointed (docs/gockpt.md): the one enum the trainer's
// --ckpt_mode, its CheckpointerOptions and the snapshot engine share. Strings exist only at the
// flag boundary (ParseSnapshotMode) and in output (SnapshotModeName).
#ifndef GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_
#define GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace gradsnap {
namespace gpu_snapshot {

enum class SnapshotMode { kNone, kSync, kAsync, kGoCkpt };

// "none", "sync", "async" or "gockpt".
const char* SnapshotModeName(SnapshotMode m);
// The inverse of SnapshotModeName; nullopt for any other string.
std::optional<SnapshotMode> ParseSnapshotMode(absl::string_view name);
// "none, sync, async, gockpt", for error messages and --help.
std::string SnapshotModeNames();

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_
