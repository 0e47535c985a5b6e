// Pieces of the training drill (benchmarks/fault_drill/training_scenario.h): checks of what a
// store lists. (Child processes, the restartable gradsnap-server and gradsnap-train's output
// come from tests/testing/.)
//
// Thread safety: none; one drill runs on one thread.
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_UTIL_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_UTIL_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "benchmarks/fault_drill/drill_util.h"
#include "client/client.h"

namespace gradsnap {
namespace drill {

// What a store lists for `job`, checked: every committed checkpoint verified (lost_data counts
// DATA_LOSS), committed checkpoints with a shard missing (partial_listed), committed DELTAs
// whose base FULL is not committed (orphan_deltas_listed), committed DELTAs whose predecessor
// in the chain is not committed (chain_holes_listed). Listed with include_pending: PENDING
// checkpoints left behind (pending_left). Against what the job printed: each of
// `recovery_points` (every recovery point the job's step lines named) not listed committed or
// not verifying (recovery_points_lost; the drill's job runs no retention, so none may go).
struct StoreReport {
  int listed = 0, fulls = 0, deltas = 0;
  int lost_data = 0, partial_listed = 0, orphan_deltas_listed = 0, chain_holes_listed = 0;
  int verify_errors = 0;  // other verification failures
  int pending_left = 0, recovery_points_lost = 0;
};
absl::StatusOr<StoreReport> CheckStore(client::Client& c, const std::string& job,
                                       const std::set<int64_t>& recovery_points);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_UTIL_H_
