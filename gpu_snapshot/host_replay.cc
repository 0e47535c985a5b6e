#include "gpu_snapshot/host_replay.h"

#include <algorithm>

#include "common/logging.h"

namespace gradsnap {
namespace gpu_snapshot {

void SplitRange(size_t n, int parts, int i, size_t* begin, size_t* end) {
  size_t per = (n + parts - 1) / parts;
  per = (per + 15) / 16 * 16;
  *begin = std::min(n, per * i);
  *end = std::min(n, *begin + per);
}

ReplayPool::ReplayPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { Worker(i); });
}

ReplayPool::~ReplayPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (auto& t : workers_) t.join();
}

void ReplayPool::Worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* fn;
    size_t n;
    {
      absl::MutexLock lock(&mu_);
      std::pair<ReplayPool*, uint64_t*> arg{this, &seen};
      mu_.Await(absl::Condition(
          +[](std::pair<ReplayPool*, uint64_t*>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return a->first->stop_ || a->first->generation_ != *a->second;
          },
          &arg));
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
    }
    size_t b, e;
    SplitRange(n, threads(), index, &b, &e);
    if (b < e) (*fn)(b, e);
    absl::MutexLock lock(&mu_);
    --pending_;
  }
}

void ReplayPool::ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn) {
  // Small ranges are not worth waking the workers.
  if (workers_.empty() || n < 64 * 1024) {
    if (n > 0) fn(0, n);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  size_t b, e;
  SplitRange(n, threads(), 0, &b, &e);
  if (b < e) fn(b, e);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* p) { return *p == 0; }, &pending_));
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
