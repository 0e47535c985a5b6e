// Retention (GcPolicy) decided from a list of checkpoints: the one implementation of the keep
// rules, used by the engine's Gc over its own catalog and by the remote client over the merged
// listing of all its nodes, with a verify that reads every rank on the node that holds it. The
// client then sends each node the FULLs to delete (docs/protocol.md, "Retention over several
// nodes"): a node deciding on its own sees only its own shards and would keep a FULL whose
// other ranks are damaged elsewhere while deleting the FULL a restore falls back to. It lives
// in common/ so the remote client links it without the engine.
//
// The rules (docs/cli.md, `gc`):
//   keep_last N   the newest FULLs, from the newest down, until N of them verify; a FULL that
//                 does not verify (DATA_LOSS) is kept but not counted, and with fewer than N
//                 FULLs that verify nothing is deleted: the checkpoint a restore of `latest`
//                 falls back to is never the one deleted;
//   keep_every K  for every multiple of K, the newest FULL at or before it;
//   DELTAs        go with their FULL (the caller deletes a doomed FULL's DELTAs with it).
//
// THREAD SAFETY: a pure function of its arguments; `verify` is called on the caller's thread.
#ifndef GRADSNAP_COMMON_GC_PLAN_H_
#define GRADSNAP_COMMON_GC_PLAN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradsnap/types.h"

namespace gradsnap {
namespace storage {

// Reads a committed FULL back whole: OK, DATA_LOSS (damaged: kept, not counted toward
// keep_last), or another error (cannot tell: gc deletes nothing).
using VerifyFullFn = std::function<absl::Status(int64_t step)>;

// The committed FULLs of `job` outside `policy`, ascending. `committed` lists the job's
// committed checkpoints (FULLs and DELTAs, any order; others are ignored). `verify` is asked
// about FULLs newest first, only as many as keep_last needs. INVALID_ARGUMENT for a negative
// keep_last or keep_every.
absl::StatusOr<std::vector<int64_t>> FullsOutsidePolicy(
    const std::string& job, const std::vector<CheckpointInfo>& committed, const GcPolicy& policy,
    const VerifyFullFn& verify);

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_GC_PLAN_H_
