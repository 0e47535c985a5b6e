// Restores any element range of a checkpointed training state from a StateSource: the FULL's
// slices read with ranged reads, then the DELTA chain replayed with the trainer's own host replay
// (gpu_snapshot/host_replay.h), so the result is bit-identical to what the trainer resumes from.
// The trainer (resume, resharding, --init-from) and the CLI (restore, export) both call it.
//
// OVERVIEW
//   RestoreRange describes FULL rp.full_step and the first DELTAs of rp.delta_steps at once, then
//   reads, all in parallel, [lo, hi) of the FULL's "params", "adam_m" and "adam_v" from
//   whichever shards hold those elements, the same range of each DELTA's "grad" and the headers
//   of the shards it overlaps; it checks the headers and applies the updates in one pass over the
//   state (ReplayPool::ApplyChain: every update of a cache-sized block at once). A DATA_LOSS while reading the FULL marks it damaged (nothing restored);
//   one while reading a DELTA stops the chain at the previous step. Either way it is reported
//   (job, step, rank, tensor) in RestoredRange::damage, never returned as data.
//   RestoreRecoveryPoint adds the fallback: newest FULL and chain, else the previous FULL...
//
// THREAD SAFETY
//   The functions use their own threads; the caller's buffers must not be touched meanwhile.
#ifndef GRADSNAP_RECOVERY_RESTORE_STATE_H_
#define GRADSNAP_RECOVERY_RESTORE_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recovery/recovery_point.h"
#include "recovery/state_source.h"

namespace gradsnap {
namespace recovery {

struct RestoreOptions {
  // Ranged reads in flight at once. A FULL and one DELTA are 3 + 1 flat pieces, plus a DELTA
  // header per shard; with fewer threads the last reads wait for the first. Default: 8
  int threads = 8;
  // A piece is fetched as ranges of at most this many bytes, cut at multiples of it from the
  // tensor's start. The store reads whole chunks (4 MiB by default) and a chunk two ranges
  // share is read twice, so ranges are long; within one range the engine reads ahead up to
  // 128 MiB in parallel, and the pieces of a slice are read concurrently. Default: 256 MiB
  uint64_t range_bytes = 256u << 20;
  // DELTA gradients fetched together (and with the FULL) before they are replayed; memory:
  // that many gradient slices. 0: as many as prefetch_bytes holds (f32 slices of [lo, hi)),
  // at least 4 and at most 64, so a restore of a small state fetches a whole chain in one
  // round of descriptions and one of reads instead of a round per 4 DELTAs. Default: 0
  int prefetch_deltas = 0;
  uint64_t prefetch_bytes = 256u << 20;
  // Replay at most this many DELTAs of the chain; -1 = all. Default: -1
  int max_deltas = -1;
};

struct RestoredRange {
  int64_t full_step = -1;
  int deltas = 0;             // DELTAs replayed
  int64_t step = -1;          // the step of the restored state
  std::string state;          // its train state text (the replicated state of `step`)
  bool full_damaged = false;  // the FULL did not read back: nothing was restored
  std::string damage;         // what was damaged and where; empty when nothing
  double fetch_ms = 0;        // reading FULL and DELTAs
  double replay_ms = 0;       // applying DELTAs
  uint64_t bytes_read = 0;    // bytes asked from the source
};

// Restores elements [lo, hi) of params/m/v (hi - lo floats each) at `rp`. Errors other than
// damage (unavailable store, a checkpoint of another shape) are returned as the status.
absl::StatusOr<RestoredRange> RestoreRange(StateSource& source, const RecoveryPoint& rp,
                                           uint64_t lo, uint64_t hi, float* master, float* m,
                                           float* v, const RestoreOptions& options);

// The recovery point with fallback: the newest FULL and its chain as far as it verifies; a
// damaged FULL falls back to the previous FULL. Every damage found is appended to *damage.
// NOT_FOUND when the source has no committed FULL at all; DATA_LOSS when it has some and every
// one is damaged (naming the last damage), so that a caller never takes that for "nothing to
// resume" and starts over. With `max_full` >= 0 the FULLs above it are passed over, as ones a
// caller already found damaged (no FULL at or below it is then DATA_LOSS too).
absl::StatusOr<RestoredRange> RestoreRecoveryPoint(StateSource& source, uint64_t lo, uint64_t hi,
                                                   float* master, float* m, float* v,
                                                   const RestoreOptions& options,
                                                   std::vector<std::string>* damage,
                                                   int64_t max_full = -1);

// DATA_LOSS for a source whose FULLs are all damaged, naming the last damage (may be empty).
absl::Status NoUndamagedFullError(const StateSource& source, const std::string& last_damage);

// The flat length of a FULL checkpoint's params (and m, v); DATA_LOSS when they disagree.
absl::StatusOr<uint64_t> FlatTotal(const CheckpointView& full);

}  // namespace recovery
}  // namespace gradsnap

#endif  // GRADSNAP_RECOVERY_RESTORE_STATE_H_
