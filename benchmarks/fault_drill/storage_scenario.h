// The storage scenario of the fault drill: real gradsnap-server processes on an operator's
// worst day (docs/format.md "Catalog guard", "Rebuilding the catalog"; docs/protocol.md).
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_STORAGE_SCENARIO_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_STORAGE_SCENARIO_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "benchmarks/fault_drill/drill_util.h"

namespace gradsnap {
namespace drill {

// Each of options.rounds rounds, on a fresh data directory: writes FULL/DELTA checkpoints over
// gRPC (plus the Begin FULL / Write DELTA / Abort FULL orphan sequence and a half-written
// checkpoint), SIGKILLs the server in the middle of an upload, restarts it, then damages the
// catalog (round r: meta/ removed, emptied, CURRENT deleted, SST files corrupted, in turn),
// checks that the server refuses to start without deleting anything, runs
// --rebuild-catalog, restarts and verifies every checkpoint listed. Round 0 also starts a
// second server on the first one's port.
//
// Results (added to *kv): segments_deleted_without_catalog (target 0), server_aborts (0),
// orphan_deltas_listed (0), refusals_missed (0), rebuild_lost_checkpoints (0),
// rebuilt_checkpoints, rebuild_verified_ratio (1), second_server_refused (1),
// storage_rounds, storage_seconds. Then, where the process may mount a 64 MiB tmpfs, a real
// full disk: full_disk_drill (ran or skipped), full_disk_resource_exhausted (1: the writer got
// RESOURCE_EXHAUSTED), full_disk_reads_served (1); its SIGTERM and its restart on the full
// disk (exit 1 expected) count in server_aborts; a full disk that cannot be mounted misses the
// target full_disk_drill=ran. Against what was written (docs/build.md "Fault drill"):
// restart_lost_checkpoints (0: the baseline, known before the kill, missing after the restart),
// rebuilt_bytes_mismatched (0: rebuilt shards whose restore differs from the bytes written),
// rebuild_chain_holes (0: a DELTA listed after the rebuild without the one before it, DELTA 62
// being damaged first), resave_damage_missed (0: a rank damaged on disk and saved again inside a
// PENDING checkpoint, not refused DATA_LOSS), storage_rounds_completed (= storage_rounds).
// Then the checks of holes_scenario.h: stale_catalog_quarantined, gc_lost_fallback,
// rebuild_fencing_lost (0 each).
// A failure to run (a server that does not start, a client error) is returned as a Status.
absl::Status RunStorageScenario(const DrillOptions& options,
                                std::map<std::string, std::string>* kv);

// True when the storage results in `kv` meet their targets (for --check).
bool StorageTargetsMet(const std::map<std::string, std::string>& kv, std::string* why);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_STORAGE_SCENARIO_H_
