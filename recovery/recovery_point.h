// Which checkpoints a restore reads (DESIGN.md section 3, "Recovery point"; docs/gockpt.md).
//
// A job's recovery point is its newest committed FULL checkpoint F plus the longest run of
// committed DELTAs F+1, F+2, ... whose base is F (the gradient log). Replaying that chain over F
// gives the state of the last DELTA's step. Restoring a specific step u means: u itself when it
// is a FULL; F + the chain F+1..u when u is a DELTA on F. Whether the records verify is decided
// while they are read (restore_state.h), which may shorten the chain or fall back to an older F.
//
// THREAD SAFETY
//   Plain values and functions.
#ifndef GRADSNAP_RECOVERY_RECOVERY_POINT_H_
#define GRADSNAP_RECOVERY_RECOVERY_POINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/types.h"

namespace gradsnap {
namespace recovery {

struct RecoveryPoint {
  int64_t full_step = -1;            // -1: the job has no committed FULL
  std::vector<int64_t> delta_steps;  // full_step + 1, full_step + 2, ... contiguous
  int64_t step() const { return delta_steps.empty() ? full_step : delta_steps.back(); }
  // "full 120 + 7 deltas -> step 127", or "full 120".
  std::string Describe() const;
};

// The newest committed FULL with step <= max_full (any when max_full < 0) and its chain.
RecoveryPoint FindRecoveryPoint(const std::vector<storage::CheckpointInfo>& list,
                                int64_t max_full = -1);

// What restoring `step` reads: a FULL alone, or a DELTA's base FULL + the chain up to it.
// NOT_FOUND when the step is not committed, or when a DELTA's base FULL or an intermediate
// DELTA is missing (the message names what is missing).
absl::StatusOr<RecoveryPoint> PlanForStep(const std::vector<storage::CheckpointInfo>& list,
                                          int64_t step);

}  // namespace recovery
}  // namespace gradsnap

#endif  // GRADSNAP_RECOVERY_RECOVERY_POINT_H_
