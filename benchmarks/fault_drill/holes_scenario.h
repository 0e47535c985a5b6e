// The storage scenario's checks of the data and fencing holes that a close reading found
// (issue 26, docs/build.md "Fault drill"): each runs real gradsnap-server processes through the
// situation that lost or mis-served data before its fix, and counts what would be lost again.
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_HOLES_SCENARIO_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_HOLES_SCENARIO_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "benchmarks/fault_drill/drill_util.h"

namespace gradsnap {
namespace drill {

// Adds to *kv (targets 0 each):
// - stale_catalog_quarantined: a job checkpointed to step 10, its catalog copied, continued to
//   step 30, the copy put back (meta/ restored from a backup): checkpoints newer than the stale
//   catalog that the server's open set aside instead of refusing to open (naming
//   --rebuild-catalog), plus any of them the rebuild does not bring back with their bytes;
// - gc_lost_fallback: two servers, one replica, ranks 0 and 1 on different nodes, rank 1 of
//   FULL 30 damaged, gc --keep-last 1: ranks of FULL 20 (what `restore latest` falls back to)
//   that no longer restore as written;
// - rebuild_fencing_lost: a job's attempts 1 and 2 each commit a FULL, then the catalog and the
//   epochs/ mirror are lost and rebuilt: 1 if attempt 1 (a zombie) may begin a checkpoint
//   after the rebuild, plus 1 if a new attempt's epoch is not above attempt 2's.
absl::Status RunHolesScenario(const DrillOptions& options, std::map<std::string, std::string>* kv);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_HOLES_SCENARIO_H_
