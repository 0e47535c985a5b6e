// The training state a checkpointer sees (the trainer <-> checkpointing seam, part 1 of 2;
// trainer/checkpointer.h is part 2). docs/trainer.md specifies both.
//
// A rank's state is
//   - its ZeRO-1 slice [lo, hi) of three flat fp32 buffers of flat_total elements each:
//     master weights, AdamW m, AdamW v (pointers stable for the whole run), and
//   - the replicated small state, identical on every rank: completed step, optimizer step
//     count t, RNG and data-loader position, LR schedule position, model config, run
//     hyperparameters. It is serialized to bytes (ReplicatedState::Serialize) and stored with
//     every shard, so a FULL checkpoint holds everything needed to resume exactly.
//
// Thread safety: plain values. The buffers behind a TrainStateView are written by the training
// loop during BeforeStep..EndStep; a checkpointer reads them inside its hooks, or on other
// threads/streams only between hooks it knows leave them unchanged (see checkpointer.h).
#ifndef GRADSNAP_TRAINER_TRAIN_STATE_H_
#define GRADSNAP_TRAINER_TRAIN_STATE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu_snapshot/adamw.h"
#include "gpu_snapshot/device_kind.h"

namespace gradsnap {
namespace trainer {

// Where the deterministic data loader is. The loader draws batch number `batch_index` (0-based,
// counting batches consumed so far) from an RNG seeded by (seed, batch_index), so this pair is
// the whole loader state.
struct LoaderPosition {
  uint64_t seed = 0;
  int64_t batch_index = 0;  // batches consumed so far == next batch to draw
};

// The replicated small state after `step` completed steps. Everything a resume needs besides
// the three flat slices.
struct ReplicatedState {
  int64_t step = 0;          // completed training steps; the next step to run is step + 1
  int64_t opt_t = 0;         // completed non-skipped AdamW updates (1-based t of the last one)
  int64_t skipped_steps = 0; // updates skipped for a non-finite gradient norm
  uint64_t seed = 0;         // run seed (parameter init and data order)
  LoaderPosition loader;
  // LR schedule (warmup + cosine): lr(step) is a pure function of these and the step.
  float max_lr = 0;
  float min_lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine horizon
  float grad_clip = 0;      // global-norm clip threshold; 0 = off
  AdamWConfig adamw;
  // Run shape: a resume must match these.
  std::string model_config;  // ModelConfigString()
  int32_t world_size = 1;
  int32_t global_batch = 0;  // sequences per step, all ranks together
  int32_t seq_len = 0;
  std::string data_fingerprint;  // "<bytes>:<sha256 of the token file>"
  // The model layout (recovery/layout.h, trainer/model_layout.h), so tools can name the
  // parameters without trainer code. Optional: empty in checkpoints of older versions.
  std::string param_layout;

  // Text, one "key=value" per line after a version line; floats as exact hex bit patterns.
  std::string Serialize() const;
  static absl::StatusOr<ReplicatedState> Parse(absl::string_view bytes);
};

// The learning rate of step `step` (1-based): linear warmup to max_lr over warmup_steps, then
// cosine decay to min_lr at total_steps, min_lr after. Computed in double, rounded once.
float LearningRate(const ReplicatedState& s, int64_t step);

// The compute back end (--device, docs/trainer.md): the snapshot engine's device kind.
using gpu_snapshot::DeviceKind;

// A rank's view of its state. Pointers are valid for the whole run.
struct TrainStateView {
  int32_t rank = 0;
  int32_t world_size = 1;
  uint64_t flat_total = 0;  // elements in each logical flat buffer (params, m, v)
  uint64_t lo = 0;          // this rank's slice [lo, hi)
  uint64_t hi = 0;
  float* master = nullptr;  // (hi - lo) fp32 master weights: elements lo..hi of the params
  float* m = nullptr;       // (hi - lo) fp32 AdamW first moment
  float* v = nullptr;       // (hi - lo) fp32 AdamW second moment
  bool on_device = false;   // true: the three pointers are device memory (CUDA or sim)
  void* stream = nullptr;   // the training compute stream when on_device (a cudaStream_t, or a
                            // gpu_snapshot::SimStream* on sim), else nullptr
  DeviceKind device = DeviceKind::kCpu;  // the back end
  int device_ordinal = 0;                // the CUDA / simulated device holding the state
  uint64_t count() const { return hi - lo; }
};

// The names of the flat buffers in a FULL shard (TensorSpec::flat_name) and of the tensors.
inline constexpr const char* kFlatParams = "params";
inline constexpr const char* kFlatAdamM = "adam_m";
inline constexpr const char* kFlatAdamV = "adam_v";
inline constexpr const char* kReplicatedTensor = "replicated_state";

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_TRAIN_STATE_H_
