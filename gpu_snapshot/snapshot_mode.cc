#include "gpu_snapshot/snapshot_mode.h"

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

std::optional<SnapshotMode> ParseSnapshotMode(absl::string_view name) {
  for (SnapshotMode m : kModes) {
    if (name == SnapshotModeName(m)) return m;
  }
  return std::nullopt;
}

std::string SnapshotModeNames() {
  std::string out;
  for (SnapshotMode m : kModes) absl::StrAppend(&out, out.empty() ? "" : ", ", SnapshotModeName(m));
  return out;
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
