// A fixed set of worker threads running queued tasks in FIFO order. Each worker owns a
// per-thread context created by `make_context` (e.g. a zstd context), passed to every task it
// runs. With zero threads, Run() executes the task on the caller's thread; so it does when no
// thread can be started (fewer start: the pool runs with those).
//
// THREAD SAFETY: Run() may be called from any thread. The destructor runs what is queued,
// then joins.
#ifndef GRADSNAP_STORAGE_TASK_POOL_H_
#define GRADSNAP_STORAGE_TASK_POOL_H_

#include <deque>
#include <functional>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsnap {
namespace storage {

template <typename Context>
class TaskPool {
 public:
  using Task = std::function<void(Context*)>;
  TaskPool(int threads, std::function<std::unique_ptr<Context>()> make_context)
      : make_context_(std::move(make_context)) {
    for (int i = 0; i < threads; ++i) {
      try {
        workers_.emplace_back([this] { Loop(); });
      } catch (const std::system_error&) {
        break;  // out of threads (RLIMIT_NPROC, a pids cgroup): fewer workers, or none
      }
    }
    if (workers_.empty()) inline_context_ = make_context_();
  }
  ~TaskPool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }
  void Run(Task task) {
    if (workers_.empty()) {
      task(inline_context_.get());
      return;
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
  }
  // Tasks queued and not yet started.
  size_t queued() {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  void Loop() {
    std::unique_ptr<Context> ctx = make_context_();
    for (;;) {
      Task task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &TaskPool::Ready));
        if (queue_.empty()) return;  // stop_ and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task(ctx.get());
    }
  }
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  std::function<std::unique_ptr<Context>()> make_context_;
  std::unique_ptr<Context> inline_context_;
  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_TASK_POOL_H_
