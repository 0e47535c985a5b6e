// The snapshot engine: gets consistent copies of a rank's training state (fp32 master params,
// Adam m and v) and per-update gradient records out of device memory with as little stall as
// possible (DESIGN.md section 4, docs/gockpt.md).
//
// OVERVIEW
//   Modes (SnapshotEngineOptions::mode):
//     kSync    stop the world: blocking copy of the whole state, persist, wait for it.
//     kAsync   blocking copy of the whole state, persist in the background (CheckFreq style).
//     kGoCkpt  the state is split into K blocks; block j is copied during step s+1+j, the
//              gradients of already-copied blocks at every later update; the host replays
//              AdamW on each block up to update s+K-1 (bit-exact, adamw.h). The result equals
//              a stop-the-world snapshot of s+K-1 byte for byte.
//     kNone    no FULL snapshots (the gradient log may still run).
//   Gradient log (grad_log): every update's gradient slice, AdamWStepParams, skip flag, loader
//   position and small state go to the sink as a DELTA record on the latest FULL.
//   One FULL checkpoint is in flight at a time (copy + replay + persist); a request while one
//   is in flight is deferred to the first update after it finishes, never dropped.
//   Memory: one host copy of the state (reused by every checkpoint), a bounded pool of
//   gradient chunks and, with the gradient log, grad_log_buffers gradient buffers; all pinned,
//   pre-touched and counted (host_bytes()).
//
// CALL PROTOCOL (the trainer's training thread, per step u)
//   BeforeGradOverwrite(u)   right before step u first overwrites the gradient buffer that
//                            AfterBackward(u-1) handed over (on the CPU: before backward u; on
//                            a GPU, whose reduced bf16 buffer is written by the reduction:
//                            before reduce u). -O: waits there for the copy of update u-1's
//                            gradients, which so overlaps the update, all-gather, forward and
//                            backward in between
//   AfterBackward(u, grad)   gradients of u are final; the update has not run yet
//   BlockInFlight()          with per_block_update_wait: the element range of the slice whose
//                            block copy may still be running (a GoCkpt block copied after
//                            update u-1), empty when none. The caller launches the update of
//                            the rest of the slice first, then
//   BeforeBlockUpdate(u)     waits for that one block's copy (its own copy event, not the
//                            step's), then the caller launches the update of that range. Without
//                            per_block_update_wait the wait is in AfterBackward and this is a
//                            no-op (callers may call it always)
//   AfterUpdate(info, due)   update u applied (or skipped); due: a FULL is wanted after it
//   TakeStepStats()          stall attributable to checkpointing in this step
//   Finish()                 at the end: closes an open window early at the last update
//                            (abandons it when the gradient log holds its steps), drains
//                            persists
//
// THREAD SAFETY
//   The hooks are called from one thread. The sink is called from the engine's worker thread
//   and must not block; it reports completion through the `done` callback (any thread).
#ifndef GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_ENGINE_H_
#define GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "gpu_snapshot/device.h"
#include "gpu_snapshot/host_replay.h"
#include "gpu_snapshot/snapshot_mode.h"
#include "gpu_snapshot/trace.h"

namespace gradsnap {
namespace gpu_snapshot {

struct SnapshotEngineOptions {
  SnapshotMode mode = SnapshotMode::kGoCkpt;  // Default: kGoCkpt
  // GoCkpt window K (blocks); 0 chooses it from measured copy bandwidth and step time.
  // Default: 0
  int window = 0;
  // Upper bound for an automatic K (keep it <= the checkpoint interval). Default: 8
  int max_window = 8;
  // Fraction of a step's time (measured on steps without state copies) that the copies a
  // window asks of the copy engine in one step (a block, the gradients of the blocks already
  // copied, the gradient log's copy) may use when K is automatic (ChooseWindow). Default: 0.8
  double window_fill = 0.8;
  // The -O variant: gradient copies overlap the update and the next forward instead of
  // blocking in AfterUpdate; needs the caller to keep gradients alive until
  // BeforeGradOverwrite (a caller that does not call it must set false). Default: true
  // (as the trainer's CheckpointerOptions::overlap_grads, --gockpt_overlap).
  bool overlap_grads = true;
  // The caller splits each update around the block in flight (BlockInFlight /
  // BeforeBlockUpdate above): the update of block b waits only for block b's copy, so the rest
  // of the update runs while that copy finishes. False: AfterBackward waits for the block
  // before the whole update. Default: false (the trainer sets it on cuda and sim)
  bool per_block_update_wait = false;
  // Log every update's gradient as a DELTA record. Default: false
  bool grad_log = false;
  // Gradient-log host buffers (each one gradient slice); 2 lets a DELTA persist while the
  // next gradient is copied. Default: 1
  int grad_log_buffers = 1;
  // Dtype of the gradient the optimizer reads: kF32 or kBF16. Default: kF32
  DType grad_dtype = DType::kF32;
  // Copy chunk size. Default: 4 MiB
  size_t chunk_bytes = 4u << 20;
  // Chunks in flight on the copy streams. Default: 2
  int copy_depth = 2;
  // Gradient staging pool: at most this fraction of the state bytes, and at most
  // grad_pool_max_bytes. Default: 0.2 and 64 MiB
  double grad_pool_fraction = 0.2;
  size_t grad_pool_max_bytes = 64u << 20;
  // A FULL due while the previous one is still persisting (its copies done) is deferred when
  // true, waited for (stall) when false. Several ranks need false: whether a persist has
  // finished differs between ranks, and their checkpoints must start at the same steps.
  // Default: true
  bool defer_while_persisting = true;
  // Host replay threads. Default: 2
  int replay_threads = 2;
  // Optional trace (not owned). Default: nullptr
  TraceWriter* trace = nullptr;
  // A frozen peer (several ranks on a device): a hook's wait for snapshot copies gives up once
  // no copy has landed for this long, for the copies then wait behind device work that never
  // ends (a collective the peer never joins, which NCCL never times out). It calls
  // abort_collectives once (which returns what it aborted, for the message) and fails with
  // UNAVAILABLE "collective deadline: ..." (common/deadline_wait.h): the rank exits and the
  // launcher restarts the job. A slow copy that keeps landing chunks never trips it. Zero: wait
  // for ever. Default: 0 (the trainer passes --collective-timeout-s on cuda and sim with
  // several ranks)
  std::chrono::milliseconds copy_stall_timeout{0};
  std::function<std::string()> abort_collectives;  // Default: none
  // Test hook: leave out one kind of wait (above); breaks the checkpoints on purpose.
  // Default: kNone
  DroppedWait test_drop_wait = DroppedWait::kNone;
};

// Elements [begin, end) of the rank's slice; begin == end: none.
struct ElemRange {
  size_t begin = 0, end = 0;
  bool empty() const { return begin >= end; }
};

// The rank's slice in device memory.
struct DeviceState {
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  size_t numel = 0;
  size_t elem_offset = 0;         // the slice's first element in the flat buffers
  // The trainer's compute stream (cudaStream_t on CUDA, the simulated stream on sim), or null.
  // Every copy waits for an event recorded on it when the copy is requested.
  void* compute_stream = nullptr;
};

// A consistent host copy of the state after update `step`. Valid until the sink's done.
struct HostSnapshot {
  int64_t step = 0;
  HostStateRef state;
  std::string small_state;
  int window = 1;           // K used (1 for sync/async)
  int64_t start_step = 0;   // s: the update after which the checkpoint started
};

// One gradient-log record. Memory valid until the sink's done.
struct DeltaRecord {
  int64_t step = 0;
  int64_t base_step = -1;
  UpdateParams update;
  uint64_t loader_position = 0;
  std::string small_state;
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  size_t numel = 0;
  size_t elem_offset = 0;
  // grad is memory the sink lent for it (SnapshotSink::LendDeltaBuffer): the sink keeps it,
  // with no copy, and the engine never touches it again.
  bool grad_in_lent_buffer = false;
};

// done(OK): durable, or taken over by a sink that persists from memory of its own and counts
// the outcome itself (the trainer's StoreSink). done(CANCELLED): the sink skipped the record
// on purpose (e.g. a DELTA whose chain was cut). Any other status: the persist failed. Failures are counted
// (EngineCounters::persist_failures) and never stop the engine; the sink decides what is fatal
// for training (trainer/persist_guard.h). The base of a DELTA is always the latest FULL started
// before it, whether or not that FULL's persist succeeds, so it is the same on every rank.
using DoneFn = std::function<void(absl::Status)>;
class SnapshotSink {
 public:
  virtual ~SnapshotSink() = default;
  // Start persisting; call done exactly once when durable or failed. Must not block long.
  virtual void PersistFull(const HostSnapshot& snapshot, DoneFn done) = 0;
  virtual void PersistDelta(const DeltaRecord& record, DoneFn done) = 0;
  // Host device only (the CPU back end, where "pinned" memory is plain memory): memory of
  // `bytes` for the next update's gradient log record, which the engine copies the gradient
  // into and PersistDelta then takes over (DeltaRecord::grad_in_lent_buffer), so the record's
  // bytes are copied once, not twice. Null: none now (the engine uses its own log buffer and
  // PersistDelta copies, or skips, as without lending). A lent buffer that never becomes a
  // record goes back through ReturnDeltaBuffer.
  virtual void* LendDeltaBuffer(size_t bytes) {
    (void)bytes;
    return nullptr;
  }
  virtual void ReturnDeltaBuffer(void* buffer) { (void)buffer; }
};

// What the engine records of one applied update (the trainer's own trainer::UpdateInfo is
// what its optimizer consumed; the checkpointer translates).
struct UpdateRecord {
  int64_t step = 0;          // the update just applied
  UpdateParams params;       // what it consumed (skipped: not applied)
  uint64_t loader_position = 0;
  std::string small_state;   // the trainer's replicated small state after this update
};

// What an automatic K is chosen from (ChooseWindow; docs/gockpt.md, "Choosing K").
struct WindowInputs {
  size_t state_bytes = 0;     // one copy of the state
  size_t grad_bytes = 0;      // one update's gradient slice
  bool grad_log = false;      // the gradient log copies every update's whole gradient
  double bandwidth = 0;       // measured copy bandwidth, bytes/s (0: not measured yet)
  double step_seconds = 0;    // measured step time, of steps without state copies (0: not yet)
  double fill = 0.8;          // fraction of a step the copies may use
  int max_window = 8;
};

// The K chosen and why.
struct WindowChoice {
  int k = 1;
  bool measured = false;  // bandwidth and step time were known (else K = min(4, max_window))
  bool fits = true;       // the window's busiest step asks at most fill * a step of copying
  double busiest_step_bytes = 0;   // the copy bytes of the window's busiest step at this K
  double step_capacity_bytes = 0;  // bandwidth * step_seconds * fill
  WindowInputs in;
};

struct StepStats {
  double stall_ms = 0;       // blocking time in the hooks since the last TakeStepStats
  bool started = false;      // a FULL checkpoint started at this step
  bool deferred = false;     // a wanted FULL was deferred (one already in flight)
  int64_t completed = -1;    // step of a FULL whose persist finished since the last call
  int window = 0;            // K of the checkpoint started here
  WindowChoice choice;       // how that K was chosen (started only)
  // Copy time asked of the copy engine in this step (at the measured bandwidth) / the step time
  // of steps without state copies (WindowInputs::step_seconds); 0 when nothing was asked or
  // nothing is measured yet. Above 1: the copy engine was asked for more than a step's worth.
  double copy_utilization = 0;
};

struct EngineCounters {
  int64_t fulls_started = 0, fulls_persisted = 0, deferred = 0;
  int64_t deltas_persisted = 0, deltas_skipped_no_base = 0;
  int64_t deltas_skipped_cut = 0;  // the sink skipped them (done(CANCELLED))
  int64_t persist_failures = 0;    // FULL and DELTA persists that reported a failure
  int64_t abandoned = 0;  // windows open at Finish with the gradient log on (docs/gockpt.md)
  int64_t closed_early = 0;  // windows open at Finish closed there (the rest copied blocking)
  double stall_ms_total = 0, replay_ms_total = 0;
  // Finish's two parts: the copies it waits for (the last gradient, what is left of a window
  // the run's end cut short), then the worker handing its last records to the sink (replays,
  // the sink's copies; the persists themselves are the sink's drain, not counted here).
  double finish_copy_ms = 0, finish_handover_ms = 0;
  uint64_t copied_bytes = 0;
  // Gradient bytes copied off the device (the log's copy, which the replay reads too, or the
  // replay's own) and the updates they came from: with the log on, exactly one gradient per
  // update.
  uint64_t grad_bytes_copied = 0;
  int64_t grad_updates = 0;
  // StepStats::copy_utilization: the largest, and the sum and count of steps that asked for
  // copies.
  double copy_util_max = 0, copy_util_sum = 0;
  int64_t copy_util_steps = 0;
  int64_t window_unfit = 0;  // automatic windows for which no K fitted (the largest was used)
  WindowChoice last_window;  // the choice of the latest FULL started
  absl::Status first_error;
};

class SnapshotEngine {
 public:
  static absl::StatusOr<std::unique_ptr<SnapshotEngine>> Create(
      Device* device, const DeviceState& state, const SnapshotEngineOptions& options,
      SnapshotSink* sink);
  virtual ~SnapshotEngine() = default;

  // The latest FULL checkpoint the gradient log extends (after a restore). Default: none (-1):
  // DELTAs are logged only once a FULL exists.
  virtual void SetBaseStep(int64_t step) = 0;

  virtual absl::Status BeforeGradOverwrite(int64_t step) = 0;
  // `grad`: device memory, numel elements of options.grad_dtype.
  virtual absl::Status AfterBackward(int64_t step, const void* grad) = 0;
  virtual ElemRange BlockInFlight() const = 0;
  virtual absl::Status BeforeBlockUpdate(int64_t step) = 0;
  virtual absl::Status AfterUpdate(const UpdateRecord& info, bool checkpoint_due) = 0;
  virtual StepStats TakeStepStats() = 0;
  // Closes an open window at the last update (abandons it with the gradient log), waits for
  // every persist. Idempotent.
  virtual absl::Status Finish() = 0;

  virtual bool in_flight() const = 0;
  // Pinned host bytes held now / at peak, and the bytes of one copy of the state.
  virtual size_t host_bytes() const = 0;
  virtual size_t host_bytes_peak() const = 0;
  virtual size_t state_bytes() const = 0;
  virtual EngineCounters counters() const = 0;
  // K the next checkpoint would use, and how it is chosen.
  virtual int NextWindow() const = 0;
  virtual WindowChoice NextWindowChoice() const = 0;
  // One update's gradient slice in bytes.
  virtual size_t grad_bytes() const = 0;
};

// The copy bytes of the busiest step of a window of K blocks: in the window's step j (1..K-1)
// the engine copies block j and the gradients of blocks 0..j-1, so the last step asks for
// state / K + (K - 1) / K * grad; with the gradient log, which copies the whole gradient every
// step (and the replay reads it), state / K + grad.
double BusiestWindowStepBytes(size_t state_bytes, size_t grad_bytes, bool grad_log, int k);

// The copy bytes of a window of K blocks that do not fit in `capacity` bytes a step: the sum
// over its steps of what each asks beyond the capacity, less what the gradient log's own copy
// would overflow in those steps without a window. An estimate of the stall the window adds.
double WindowOverflowBytes(size_t state_bytes, size_t grad_bytes, bool grad_log, int k,
                           double capacity);

// The smallest K in [1, max_window] whose busiest step fits in fill * step_seconds of copying
// at `bandwidth`; when none does, fits = false and K is the one with the least overflow
// (WindowOverflowBytes: each block's gradient is copied for the rest of the window, so when a
// gradient alone outlasts a step a shorter window stalls less; with the log a longer one does).
// Before anything is measured, K = min(4, max_window).
WindowChoice ChooseWindow(const WindowInputs& in);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_SNAPSHOT_ENGINE_H_
