// A compute back end of the trainer: where the flat buffers live and how one data-parallel step
// is computed. The CPU back end (fp32, OpenBLAS, Gloo) is the reference; the CUDA back end
// (bf16 compute, fp32 master weights, bf16 gradients, NCCL) lives in cuda_backend.cu.
//
// A step is: ForwardBackward (local micro-batch, gradients zeroed first), ReduceGrads (ZeRO-1
// reduce-scatter; returns the local loss sum and this rank's share of the squared gradient
// norm), Update (AdamW over this rank's slice, via gpu_snapshot/adamw.h), GatherParams
// (all-gather of the slices). On a device (CUDA, sim) the calls enqueue work on the compute
// stream and return at once; ReduceGrads is the one point per step where the host waits for the
// device (the loss print and the clip coefficient need the two sums).
//
// Thread safety: one thread at a time.
#ifndef GRADSNAP_TRAINER_BACKEND_H_
#define GRADSNAP_TRAINER_BACKEND_H_

#include <chrono>
#include <memory>
#include <string>
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
  // inputs/targets: (local_batch, seq_len) on the host (read before the call returns).
  virtual absl::Status ForwardBackward(const int32_t* inputs, const int32_t* targets,
                                       float dloss) = 0;
  struct Sums {
    double loss_sum = 0;  // sum of the token losses of the last ForwardBackward (this rank)
    double grad_sq = 0;   // this rank's share of the squared norm of the reduced gradient
  };
  virtual absl::StatusOr<Sums> ReduceGrads() = 0;
  // True when ReduceGrads (not ForwardBackward) is what first overwrites the gradient slice
  // that Grads() points at (a device's separate reduced bf16/slice buffer); the trainer puts
  // the checkpointer's BeforeGradOverwrite hook right before that call.
  virtual bool ReduceOverwritesGrads() const = 0;
  virtual GradSliceView Grads() = 0;
  // AdamW over this rank's slice: all of it, or elements [begin, end) of it (the result is the
  // same whichever way the slice is cut: the update is element by element). The trainer cuts it
  // around the block a checkpoint copy still reads (Checkpointer::BlockInFlight).
  absl::Status Update(const AdamWStepParams& params) {
    return UpdateRange(params, 0, View().count());
  }
  virtual absl::Status UpdateRange(const AdamWStepParams& params, size_t begin, size_t end) = 0;
  virtual absl::Status GatherParams() = 0;
  // Stall accounting of a checkpointing hook that just returned after `elapsed_ms` on the host:
  // the part of it during which the device had no queued work left, i.e. training waited for
  // the hook. CPU: all of it. sim: exact (the compute stream knows when it went idle). CUDA: 0
  // when the work enqueued before the hook is still running, else all of it (an upper bound).
  virtual double StalledMillis(double elapsed_ms) { return elapsed_ms; }
  // Aborts the device's collectives (CUDA: the NCCL communicator, sim: the device's group) so
  // that device work stuck in one behind a frozen peer fails and the streams drain; returns what
  // it aborted, for the one line. The checkpointer calls it when a hook's wait for snapshot
  // copies queued after such work passes --collective-timeout-s
  // (CheckpointerOptions::abort_collectives). Training thread. CPU (Gloo's own timeout bounds
  // its collectives): nothing.
  virtual std::string AbortCollectives() { return "nothing"; }
  // The full fp32 master parameters (every rank's slice) on the host. Collective.
  virtual absl::Status FullMasterParams(std::vector<float>* out) = 0;
};

// The views the back ends hand out for this rank's `slice` of flat buffers of `flat_total`
// elements: master, m and v hold slice.size() floats each, grads slice.size() of `dtype`. On a
// device the caller adds on_device and, for the state, the stream and device.
inline TrainStateView SliceStateView(const Comm& comm, uint64_t flat_total, const RankSlice& slice,
                                     float* master, float* m, float* v) {
  TrainStateView view;
  view.rank = comm.rank();
  view.world_size = comm.world_size();
  view.flat_total = flat_total;
  view.lo = slice.lo;
  view.hi = slice.hi;
  view.master = master;
  view.m = m;
  view.v = v;
  return view;
}
inline GradSliceView SliceGradView(const RankSlice& slice, const void* grads, DType dtype) {
  GradSliceView view;
  view.data = grads;
  view.dtype = dtype;
  view.lo = slice.lo;
  view.hi = slice.hi;
  return view;
}

// `comm` must outlive the back end. local_batch sequences of seq_len tokens per step. The
// layers, the optimizer and the gradient norm run on `threads` threads (>= 1; OpenBLAS's own
// count is set apart, openblas_set_num_threads); the results do not depend on it.
std::unique_ptr<Backend> NewCpuBackend(const ModelConfig& config, int local_batch, int seq_len,
                                       Comm* comm, int threads = 1);

// CUDA (cuda_backend.cu) on device `device_ordinal` (the rank's local index on its node plus
// --device_id), which it makes the training thread's current device. UNIMPLEMENTED when built
// without CUDA; FAILED_PRECONDITION when no GPU is present; INVALID_ARGUMENT for an ordinal
// that does not exist. The NCCL unique id is exchanged through `comm`. With several ranks every
// host wait for device work polls its event with `collective_timeout` (--collective-timeout-s)
// and, when it passes, aborts the NCCL communicator (ncclCommAbort) and fails with UNAVAILABLE
// "collective deadline: ..." (common/deadline_wait.h); zero: no deadline.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(
    const ModelConfig& config, int local_batch, int seq_len, Comm* comm, int device_ordinal = 0,
    std::chrono::milliseconds collective_timeout = std::chrono::milliseconds(0));

// Deterministic GPT-2 initialization of the flat parameters (same on every rank):
// N(0, 0.02) weights, N(0, 0.02/sqrt(2L)) residual projections, zero biases, unit LayerNorms.
void InitParams(const ModelConfig& config, uint64_t seed, float* params);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_BACKEND_H_
