#include "gpu_snapshot/host_replay.h"

#include <algorithm>

#include "common/logging.h"

namespace gradsnap {
namespace gpu_snapshot {

ReplayPool::ReplayPool(int threads) : pool_(threads, ThreadRole::kBackground) {}

void ReplayPool::ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn) {
  // Small ranges are not worth waking the workers.
  pool_.ParallelFor(n, fn, /*min_n=*/64 * 1024, /*align=*/16);
}

void ReplayPool::Apply(const HostStateRef& state, size_t begin, size_t end, const void* grad,
                       DType dtype, const UpdateParams& u) {
  GS_CHECK(end <= state.numel && begin <= end) << begin << ".." << end << " of " << state.numel;
  if (u.skipped) return;  // the device skipped this update too
  const AdamWStepParams h = u.adamw;
  ParallelFor(end - begin, [&](size_t b, size_t e) {
    size_t i0 = begin + b;
    if (dtype == DType::kBF16) {
      AdamWUpdateHostBf16(state.params + i0, state.m + i0, state.v + i0,
                          static_cast<const uint16_t*>(grad) + b, e - b, h);
    } else {
      AdamWUpdateHost(state.params + i0, state.m + i0, state.v + i0,
                      static_cast<const float*>(grad) + b, e - b, h);
    }
  });
}

void ReplayPool::ApplyChain(const HostStateRef& state, size_t begin, size_t end,
                            const std::vector<ChainStep>& steps) {
  GS_CHECK(end <= state.numel && begin <= end) << begin << ".." << end << " of " << state.numel;
  ParallelFor(end - begin, [&](size_t b, size_t e) {
    for (size_t lo = b; lo < e; lo += kChainBlock) {
      const size_t hi = std::min(e, lo + kChainBlock), i0 = begin + lo;
      for (const ChainStep& s : steps) {
        if (s.update.skipped) continue;  // the device skipped this update too
        if (s.dtype == DType::kBF16) {
          AdamWUpdateHostBf16(state.params + i0, state.m + i0, state.v + i0,
                              static_cast<const uint16_t*>(s.grad) + lo, hi - lo,
                              s.update.adamw);
        } else {
          AdamWUpdateHost(state.params + i0, state.m + i0, state.v + i0,
                          static_cast<const float*>(s.grad) + lo, hi - lo, s.update.adamw);
        }
      }
    }
  });
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
