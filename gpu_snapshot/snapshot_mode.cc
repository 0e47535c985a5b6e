#include "gpu_snapshot/snapshot_mode.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace gpu_snapshot {

namespace {
constexpr EnumName<SnapshotMode> kModes[] = {{SnapshotMode::kNone, "none"},
                                             {SnapshotMode::kSync, "sync"},
                                             {SnapshotMode::kAsync, "async"},
                                             {SnapshotMode::kGoCkpt, "gockpt"}};
constexpr EnumName<DroppedWait> kWaits[] = {{DroppedWait::kNone, "none"},
                                            {DroppedWait::kBlock, "block"},
                                            {DroppedWait::kGrad, "grad"},
                                            {DroppedWait::kReplay, "replay"}};
}  // namespace

const char* SnapshotModeName(SnapshotMode m) { return NameOf(m, kModes); }

absl::StatusOr<SnapshotMode> ParseSnapshotMode(absl::string_view name) {
  return ParseName(name, kModes, "--ckpt_mode");
}

absl::StatusOr<DroppedWait> ParseDroppedWait(absl::string_view name) {
  return ParseName(name, kWaits, "--test_drop_wait");
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
