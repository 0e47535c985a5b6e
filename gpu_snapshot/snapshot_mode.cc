#include "gpu_snapshot/snapshot_mode.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace gpu_snapshot {

namespace {
constexpr SnapshotMode kModes[] = {SnapshotMode::kNone, SnapshotMode::kSync,
                                   SnapshotMode::kAsync, SnapshotMode::kGoCkpt};
}  // namespace

const char* SnapshotModeName(SnapshotMode m) {
  switch (m) {
    case SnapshotMode::kNone: return "none";
    case SnapshotMode::kSync: return "sync";
    case SnapshotMode::kAsync: return "async";
    case SnapshotMode::kGoCkpt: return "gockpt";
  }
  return "?";
}

absl::StatusOr<SnapshotMode> ParseSnapshotMode(absl::string_view name) {
  return ParseEnumName(name, kModes, SnapshotModeName, "--ckpt_mode");
}

const char* DroppedWaitName(DroppedWait w) {
  switch (w) {
    case DroppedWait::kNone: return "none";
    case DroppedWait::kBlock: return "block";
    case DroppedWait::kGrad: return "grad";
    case DroppedWait::kReplay: return "replay";
  }
  return "?";
}

absl::StatusOr<DroppedWait> ParseDroppedWait(absl::string_view name) {
  static constexpr DroppedWait kWaits[] = {DroppedWait::kNone, DroppedWait::kBlock,
                                           DroppedWait::kGrad, DroppedWait::kReplay};
  return ParseEnumName(name, kWaits, DroppedWaitName, "--test_drop_wait");
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
