// A fixed set of worker threads that run one data-parallel loop at a time: ParallelFor cuts
// [0, n) into threads() contiguous ranges, runs range 0 on the caller and the others on the
// workers, and returns when all are done. Which thread runs which range depends only on n, the
// thread count and the alignment, so work partitioned this way (each output element written by
// one range, in a fixed order inside it) gives the same bits with any thread count.
// Idle workers sleep (no spinning), so the pool leaves the cores to other thread pools (such as
// OpenBLAS's) between loops.
//
// THREAD SAFETY
//   ParallelFor may be called from one thread at a time; the workers are internal.
#ifndef GRADSNAP_COMMON_THREAD_POOL_H_
#define GRADSNAP_COMMON_THREAD_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_priority.h"

namespace gradsnap {

// Range of part `i` of `parts` over [0, n): ceil(n / parts) rounded up to a multiple of `align`
// (>= 1) per part, the last parts possibly shorter or empty.
void SplitRange(size_t n, int parts, int i, size_t* begin, size_t* end, size_t align = 1);

class ThreadPool {
 public:
  // threads >= 1 (1: every loop runs on the caller). role: the workers' scheduling role
  // (common/thread_priority.h); the caller, which runs part 0, keeps its own.
  explicit ThreadPool(int threads, ThreadRole role = ThreadRole::kForeground);
  ~ThreadPool();  // Not copyable (owns its worker threads and mutex).
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(begin, end) over the SplitRange(n, threads(), i, align) ranges; when n < min_n
  // (not worth waking the workers) runs fn(0, n) on the caller.
  void ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_n = 1,
                   size_t align = 1);

 private:
  void Worker(int index);

  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  const std::function<void(size_t, size_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t n_ ABSL_GUARDED_BY(mu_) = 0;
  size_t align_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// pool->ParallelFor(n, fn, min_n), or fn(0, n) on the caller when pool is null.
inline void ParallelFor(ThreadPool* pool, size_t n, const std::function<void(size_t, size_t)>& fn,
                        size_t min_n = 1) {
  if (pool == nullptr) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, fn, min_n);
}

// Runs fn(i) for each i in [0, n), at most `threads` at a time: min(n, threads) threads of
// its own each take the next index when done with one, while the caller runs `meanwhile` (if
// any); returns when every fn(i) ran. For fan-outs of blocking calls (round trips to a store),
// where one slow call must not hold a fixed range of others as ParallelFor's would.
void ForEachConcurrently(size_t n, size_t threads, const std::function<void(size_t)>& fn,
                         const std::function<void()>& meanwhile = nullptr);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_THREAD_POOL_H_
