// The checkpointing seam of the training loop (part 2 of 2; trainer/train_state.h is part 1).
//
// OVERVIEW
//   The trainer (trainer/trainer.cc) runs, for every step s = 1, 2, ... on every rank:
//
//     BeforeStep(s)
//     [BeforeGradOverwrite(s)]      CPU: here, before the backward overwrites the gradients
//     forward + backward on batch s
//     [BeforeGradOverwrite(s)]      CUDA and sim: here, before the reduction overwrites the
//                                   reduced-gradient buffer (Backend::ReduceOverwritesGrads)
//     reduce-scatter of the gradients (ZeRO-1)
//     AfterBackward(s, grads)       grads: this rank's reduced slice, as the optimizer reads it
//     global-norm clip, LR schedule -> AdamWStepParams (computed once, on the host)
//     AdamW update of the slice but BlockInFlight() (skipped when the gradient norm is not
//                                   finite; everything when BlockInFlight() is empty)
//     BeforeBlockUpdate(s)          waits for the copy of the one block in flight (a GoCkpt
//                                   block copied after update s-1; CUDA and sim only)
//     AdamW update of BlockInFlight() (skipped likewise)
//     AfterUpdate(s, info)          the exact scalars the update consumed
//     all-gather of the parameters
//     EndStep(s, state)             state: the replicated state after step s
//
//   After the last step, Finish(). The trainer measures the wall time spent inside the hooks and
//   reports it as the step's `stall_ms`: whatever a checkpointer does synchronously is stall.
//   Between AfterBackward and AfterUpdate the slice's master/m/v are being updated; between
//   EndStep(s) and AfterBackward(s+1) they hold the state after update s and are not written.
//   On the CUDA path, "between hooks" is in stream order: work enqueued on view.stream before a
//   hook returns is ordered with the training kernels.
//
// MODES (MakeCheckpointer in trainer/checkpointer_factory.cc)
//   none: no-op. sync: stop-the-world, copy + persist a FULL shard through the client in
//   EndStep(s) when s % every == 0. async and gockpt: the snapshot engine of gpu_snapshot/
//   (trainer/snapshot_checkpointer.h, docs/gockpt.md).
//
// FULL SHARD FORMAT (docs/trainer.md): tensors "params", "adam_m", "adam_v" (f32, shape
//   {hi - lo}, flat_name = the same, flat_offset = lo, flat_total = flat_total) and
//   "replicated_state" (u8, ReplicatedState::Serialize()); ShardSpec::metadata and
//   CheckpointSpec::metadata also carry the serialized replicated state.
//
// ERRORS
//   A non-OK status from any hook stops the rank with that error (the launcher restarts the job).
//   A failed persist is not such an error: it is counted and training goes on
//   (trainer/persist_guard.h), unless it is permanent or --ckpt_on_failure is stop.
//
// THREAD SAFETY
//   Hooks are called from the training thread only, in the order above. Implementations may run
//   their own threads.
#ifndef GRADSNAP_TRAINER_CHECKPOINTER_H_
#define GRADSNAP_TRAINER_CHECKPOINTER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "gpu_snapshot/adamw.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "gpu_snapshot/snapshot_mode.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

class ShardStore;

// This rank's reduced gradient slice [lo, hi) before the clip coefficient is applied, exactly
// as AdamW reads it (AdamWElement multiplies by params.grad_scale itself).
struct GradSliceView {
  const void* data = nullptr;
  DType dtype = DType::kF32;  // kF32 (CPU back end) or kBF16 (CUDA mixed precision)
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool on_device = false;
  uint64_t count() const { return hi - lo; }
};

// What update `step` consumed.
struct UpdateInfo {
  AdamWStepParams params;  // lr, grad_scale (clip coefficient), betas, eps, wd, bias corrections
  bool skipped = false;    // true: no update ran and opt_t did not advance
  int64_t opt_t = 0;       // optimizer step count after this update
  float grad_norm = 0;     // global norm of the unclipped gradient (may be inf/nan if skipped)
  LoaderPosition loader;   // the loader position after this step's batch
};

// Constant for the run, given to the factory.
struct CheckpointerOptions {
  // --ckpt_mode (parsed once, by gradsnap-train). Default: kNone
  gpu_snapshot::SnapshotMode mode = gpu_snapshot::SnapshotMode::kNone;
  int64_t every = 0;          // FULL checkpoint when step % every == 0; 0 = never. Default: 0
  bool grad_log = false;      // also stream per-step DELTA records (docs/gockpt.md). Default: false
  std::string job = "job";    // job name in the store. Default: "job"
  // Whether the run writes checkpoints at all (FULLs, or the gradient log's DELTAs).
  bool writes() const { return mode != gpu_snapshot::SnapshotMode::kNone || grad_log; }
  // gockpt (docs/gockpt.md): the window K in steps; 0 = from measured copy bandwidth and step
  // time (single rank) or min(4, every / 2) (several ranks, which must agree). Default: 0
  int gockpt_window = 0;
  // gockpt/-O (SnapshotEngineOptions::overlap_grads, flag --gockpt_overlap): gradient copies
  // overlap the update and the all-gather instead of blocking. Default: true
  bool overlap_grads = true;
  // Chrome trace-event JSON of compute phases, copies, replay and persists. Default: empty
  std::string trace_file;
  // The longest back-off after failed persists: checkpoints are tried again no sooner than
  // 100 ms after a failure, doubling per further failure up to this (trainer/persist_guard.h;
  // --ckpt_persist_timeout_ms). A failed persist itself is never retried. Default: 5000
  int64_t persist_timeout_ms = 5000;
  // async and gockpt: the host memory the checkpoints waiting for the store may hold, per rank
  // (trainer/persist_backlog.h; --ckpt_backlog_bytes); a new checkpoint that does not fit is
  // skipped on every rank. 0: automatic, one FULL shard plus 8 DELTA records of the rank,
  // at least 64 MiB. Default: 0
  uint64_t backlog_bytes = 0;
  // false (--ckpt_on_failure continue): a failed persist is counted and training goes on; true
  // (stop): it stops the rank like any error. Default: false
  bool stop_on_failure = false;
  // (testing) --test_drop_wait: the snapshot engine leaves out one kind of wait
  // (gpu_snapshot::SnapshotEngineOptions::test_drop_wait). Default: kNone
  gpu_snapshot::DroppedWait test_drop_wait = gpu_snapshot::DroppedWait::kNone;
  // Several ranks on a device (set by the trainer from --collective-timeout-s, not a flag of its
  // own): a hook's wait for snapshot copies that lands nothing for this long aborts the device's
  // collectives (abort_collectives: Backend::AbortCollectives) and fails with UNAVAILABLE
  // "collective deadline: ..." (gpu_snapshot::SnapshotEngineOptions::copy_stall_timeout).
  // Zero: no deadline. Default: 0
  std::chrono::milliseconds copy_stall_timeout{0};
  std::function<std::string()> abort_collectives;  // Default: none
};

// How checkpointing is doing, for the step lines (docs/trainer.md).
struct CheckpointHealth {
  int64_t failures = 0;         // persists that failed on some rank
  int64_t skipped = 0;          // DELTAs skipped because their chain was cut
  // Checkpoints skipped untried: a rank's backlog had no room, or the ranks were backing off
  // after failures (a FULL among them cuts its chain, whose DELTAs count in `skipped`).
  int64_t untried = 0;
  int64_t fulls = 0;            // FULLs committed by this attempt
  int64_t deltas = 0;           // DELTAs committed by this attempt
  int64_t recovery_point = -1;  // newest step a resume would restore; -1: none
  double recovery_age_s = 0;    // seconds since that step ended (0 when none)
};

class Checkpointer {
 public:
  virtual ~Checkpointer() = default;
  // Once, before the first step of this attempt, after initialization or restore. `state` is the
  // replicated state the run starts from (step 0 or the restored step).
  virtual absl::Status Start(const ReplicatedState& state) = 0;
  virtual absl::Status BeforeStep(int64_t step) = 0;
  // Right before step `step` first overwrites the gradient slice handed to AfterBackward(step-1)
  // (see the order above): the last moment a copy of those gradients may still be running.
  virtual absl::Status BeforeGradOverwrite(int64_t) { return absl::OkStatus(); }
  virtual absl::Status AfterBackward(int64_t step, const GradSliceView& grads) = 0;
  // After AfterBackward(step): the part of the slice whose copy may still be running (the
  // update launches the rest first); empty: none, BeforeBlockUpdate(step) waits for nothing.
  virtual gpu_snapshot::ElemRange BlockInFlight() const { return {}; }
  // Before update `step` writes BlockInFlight(): waits for that block's copy only.
  virtual absl::Status BeforeBlockUpdate(int64_t) { return absl::OkStatus(); }
  virtual absl::Status AfterUpdate(int64_t step, const UpdateInfo& info) = 0;
  virtual absl::Status EndStep(int64_t step, const ReplicatedState& state) = 0;
  // After the last step: drain in-flight checkpoints (their time counts in the summary).
  virtual absl::Status Finish() = 0;
  // Any thread. Default: nothing to report.
  virtual CheckpointHealth Health() const { return CheckpointHealth(); }
  // Writes what the run has to show so far (the --trace file) while the rest still stands: a
  // failed attempt's rank calls it before it exits without tearing down (train_main.cc).
  virtual absl::Status FlushDiagnostics() { return absl::OkStatus(); }
};

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CHECKPOINTER_H_
