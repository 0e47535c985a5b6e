// Host replay of AdamW: rolls fp32 state (params, m, v) forward by one logged update with
// exactly the device's arithmetic (gpu_snapshot/adamw.h AdamWElement, -ffp-contract=off), split
// over a fixed set of worker threads. A skipped update is a no-op: the logged flag decides,
// nothing is recomputed.
//
// THREAD SAFETY
//   ReplayPool::ParallelFor and Apply may be called from one thread at a time (the engine's
//   replay thread, or a restore); the pool's workers are internal.
#ifndef GRADSNAP_GPU_SNAPSHOT_HOST_REPLAY_H_
#define GRADSNAP_GPU_SNAPSHOT_HOST_REPLAY_H_

#include <cstddef>
#include <functional>
#include <vector>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "gpu_snapshot/adamw.h"

namespace gradsnap {
namespace gpu_snapshot {

// What one update consumed besides the gradient (the DELTA record's scalars).
struct UpdateParams {
  AdamWStepParams adamw;
  bool skipped = false;
};

// fp32 state arrays of one slice, all of the same length, in host memory.
struct HostStateRef {
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  size_t numel = 0;
};

class ReplayPool {
 public:
  // threads >= 1 (1: run on the caller). Default (in callers): 2.
  explicit ReplayPool(int threads);
  int threads() const { return pool_.threads(); }

  // Runs fn(begin, end) over [0, n) cut into threads() ranges aligned to 16 elements;
  // returns when all are done.
  void ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn);

  // Applies one update to elements [begin, end) of `state`; `grad` holds the gradient of those
  // elements (grad[0] is element `begin`) as fp32 or bf16.
  void Apply(const HostStateRef& state, size_t begin, size_t end, const void* grad, DType dtype,
             const UpdateParams& u);

  // One update of a chain: its gradient of elements [begin, end) and how it was applied.
  struct ChainStep {
    const void* grad = nullptr;
    DType dtype = DType::kF32;
    UpdateParams update;
  };
  // Applies `steps` in order to elements [begin, end) of `state`, block by block: every update
  // of a block of kChainBlock elements while it is in cache, so the state is read and written
  // once for the chain, not once per update. Each element sees the same operations in the same
  // order as Apply called per step, so the result is bit-identical.
  static constexpr size_t kChainBlock = 4096;
  void ApplyChain(const HostStateRef& state, size_t begin, size_t end,
                  const std::vector<ChainStep>& steps);

 private:
  ThreadPool pool_;
};

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_HOST_REPLAY_H_
