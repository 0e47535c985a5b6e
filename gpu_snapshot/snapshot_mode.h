// How a rank's training state is checkpointed (docs/gockpt.md): the one enum the trainer's
// --ckpt_mode, its CheckpointerOptions and the snapshot engine share. Strings exist only at the
// flag boundary (ParseSnapshotMode) and in output (SnapshotModeName).
#ifndef GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_
#define GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradsnap {
namespace gpu_snapshot {

// An enum flag's values and their names, for the enum flags of the trainer and the simulated
// device: NameOf(value) ("?" for none), and ParseName, its inverse: INVALID_ARGUMENT "unknown
// FLAG 'NAME' (known: a, b, c)" for any other string.
template <typename E>
struct EnumName {
  E value;
  const char* name;
};
template <typename E, size_t N>
const char* NameOf(E value, const EnumName<E> (&names)[N]) {
  for (const EnumName<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return "?";
}
template <typename E, size_t N>
absl::StatusOr<E> ParseName(absl::string_view name, const EnumName<E> (&names)[N],
                            absl::string_view flag) {
  std::string known;
  for (const EnumName<E>& n : names) {
    if (name == n.name) return n.value;
    absl::StrAppend(&known, known.empty() ? "" : ", ", n.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", flag, " '", name, "' (known: ", known, ")"));
}

enum class SnapshotMode { kNone, kSync, kAsync, kGoCkpt };

// "none", "sync", "async" or "gockpt".
const char* SnapshotModeName(SnapshotMode m);
// The inverse of SnapshotModeName; INVALID_ARGUMENT "unknown --ckpt_mode 'NAME' (known: none,
// sync, async, gockpt)" for any other string.
absl::StatusOr<SnapshotMode> ParseSnapshotMode(absl::string_view name);

// Test hook SnapshotEngineOptions::test_drop_wait: one kind of wait the engine leaves out, so a
// test shows that the simulated device's late_copies mode (sim_device.h) catches it:
//   kBlock   the host's wait for a block copy before the next update overwrites the block (with
//            per_block_update_wait: before the update of that block, BeforeBlockUpdate);
//   kGrad    the host's wait for a gradient copy before the next reduction overwrites it;
//   kReplay  the replay's wait for a gradient chunk to land before it reads it (the chunk is
//            replayed as soon as its copy is enqueued; AfterUpdate then waits until the worker
//            replayed it, so the replay always reads the chunk before it landed).
enum class DroppedWait { kNone, kBlock, kGrad, kReplay };
// --test_drop_wait: "none", "block", "grad" or "replay"; INVALID_ARGUMENT "unknown
// --test_drop_wait 'X' (known: none, block, grad, replay)" for any other string.
absl::StatusOr<DroppedWait> ParseDroppedWait(absl::string_view name);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_MODE_H_
