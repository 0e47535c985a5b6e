// A compute back end of the trainer: where the flat buffers live and how one data-parallel step
// is computed. The CPU back end (fp32, OpenBLAS, Gloo) is the reference; the CUDA back end
// (bf16 compute, fp32 master weights, bf16 gradients, NCCL) lives in cuda_backend.cu.
//
// A step is: ForwardBackward (local micro-batch, gradients zeroed first), ReduceGrads (ZeRO-1
// reduce-scatter; returns this rank's share of the squared gradient norm), Update (AdamW over
// this rank's slice, via gpu_snapshot/adamw.h), GatherParams (all-gather of the slices).
//
// Thread safety: one thread at a time.
#ifndef GRADSNAP_TRAINER_BACKEND_H_
#define GRADSNAP_TRAINER_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_snapshot/adamw.h"
#include "trainer/checkpointer.h"
#include "trainer/comm.h"
#include "trainer/model_config.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

class Backend {
 public:
  virtual ~Backend() = default;
  // This rank's state slices (stable pointers).
  virtual TrainStateView View() = 0;
  // Sets all parameters from host fp32 (ParamLayout order) and zeroes the moments.
  virtual absl::Status SetParams(const float* host) = 0;
  // Copies this rank's master/m/v slice to / from host memory (view.count() floats each);
  // FromHost also refreshes the compute parameters of all ranks (collective).
  virtual absl::Status SliceToHost(float* master, float* m, float* v) = 0;
  virtual absl::Status SliceFromHost(const float* master, const float* m, const float* v) = 0;
  // inputs/targets: (local_batch, seq_len) on the host. Returns the sum of token losses.
  virtual absl::StatusOr<double> ForwardBackward(const int32_t* inputs, const int32_t* targets,
                                                 float dloss) = 0;
  virtual absl::StatusOr<double> ReduceGrads() = 0;
  virtual GradSliceView Grads() = 0;
  virtual absl::Status Update(const AdamWStepParams& params) = 0;
  virtual absl::Status GatherParams() = 0;
  // The full fp32 master parameters (every rank's slice) on the host. Collective.
  virtual absl::Status FullMasterParams(std::vector<float>* out) = 0;
};

// `comm` must outlive the back end. local_batch sequences of seq_len tokens per step.
std::unique_ptr<Backend> NewCpuBackend(const ModelConfig& config, int local_batch, int seq_len,
                                       Comm* comm);

// CUDA (cuda_backend.cu). UNIMPLEMENTED when built without CUDA; FAILED_PRECONDITION when no
// GPU is present. With several ranks, rank 0 sends the NCCL unique id to the others over `comm`.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(const ModelConfig& config,
                                                        int local_batch, int seq_len,
                                                        Comm* comm);

// Deterministic GPT-2 initialization of the flat parameters (same on every rank):
// N(0, 0.02) weights, N(0, 0.02/sqrt(2L)) residual projections, zero biases, unit LayerNorms.
void InitParams(const ModelConfig& config, uint64_t seed, float* params);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_BACKEND_H_
