#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

namespace gradsnap {

void SplitRange(size_t n, int parts, int i, size_t* begin, size_t* end, size_t align) {
  size_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  *begin = std::min(n, per * i);
  *end = std::min(n, *begin + per);
}

ThreadPool::ThreadPool(int threads, ThreadRole role) {
  for (int i = 1; i < std::max(1, threads); ++i) {
    workers_.emplace_back([this, i, role] {
      EnterRole(role);
      Worker(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::Worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* fn;
    size_t n, align;
    {
      absl::MutexLock lock(&mu_);
      std::pair<ThreadPool*, uint64_t*> arg{this, &seen};
      mu_.Await(absl::Condition(
          +[](std::pair<ThreadPool*, uint64_t*>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return a->first->stop_ || a->first->generation_ != *a->second;
          },
          &arg));
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
      align = align_;
    }
    size_t b, e;
    SplitRange(n, threads(), index, &b, &e, align);
    if (b < e) (*fn)(b, e);
    absl::MutexLock lock(&mu_);
    --pending_;
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn,
                             size_t min_n, size_t align) {
  align = std::max<size_t>(1, align);
  if (workers_.empty() || n < min_n) {
    if (n > 0) fn(0, n);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    align_ = align;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  size_t b, e;
  SplitRange(n, threads(), 0, &b, &e, align);
  if (b < e) fn(b, e);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* p) { return *p == 0; }, &pending_));
}

void ForEachConcurrently(size_t n, size_t threads, const std::function<void(size_t)>& fn,
                         const std::function<void()>& meanwhile) {
  std::atomic<size_t> next{0};
  auto drain = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> workers;
  for (size_t t = 0; t < std::min(n, threads); ++t) workers.emplace_back(drain);
  if (meanwhile) meanwhile();
  for (std::thread& w : workers) w.join();
}

}  // namespace gradsnap
