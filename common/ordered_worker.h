// A FIFO of jobs run in order by one thread, as a device stream runs its work: job k (1-based,
// in Enqueue order) completes event k. The first failed job's status is kept and returned by
// every later Enqueue and Wait: a failed worker stays failed, like a CUDA stream after an
// error. Used by the simulated and host devices' streams (gpu_snapshot/) and the trainer's store
// sink.
//
// THREAD SAFETY: thread-safe. The destructor runs the jobs still queued, then joins the thread;
// `run` must stay callable until then (declare the worker after what `run` uses).
#ifndef GRADSNAP_COMMON_ORDERED_WORKER_H_
#define GRADSNAP_COMMON_ORDERED_WORKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/thread_priority.h"

namespace gradsnap {

template <typename Job>
class OrderedWorker {
 public:
  using RunFn = std::function<absl::Status(Job&)>;
  // role: the thread's scheduling role (common/thread_priority.h).
  explicit OrderedWorker(RunFn run, ThreadRole role = ThreadRole::kForeground)
      : run_(std::move(run)), role_(role), thread_([this] { Loop(); }) {}
  ~OrderedWorker() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  // Queues `job`; returns at once. The worker's first error instead once a job failed.
  absl::Status Enqueue(Job job) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    jobs_.push_back(std::move(job));
    ++enqueued_;
    return absl::OkStatus();
  }
  // The event of the last job queued so far (the number of jobs queued).
  uint64_t Record() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return enqueued_;
  }
  bool Reached(uint64_t event) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return completed_ >= event;
  }
  // Blocks until the first `event` jobs ran; returns the worker's first error.
  absl::Status Wait(uint64_t event) ABSL_LOCKS_EXCLUDED(mu_) {
    const Done done{this, event};
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done));
    return status_;
  }
  absl::Status Synchronize() { return Wait(Record()); }
  // Nanoseconds (MonotonicNanos clock) since every queued job completed; 0 while busy.
  int64_t IdleNanos() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (completed_ < enqueued_) return 0;
    return MonotonicNanos() - idle_since_ns_;
  }

 private:
  // Await's conditions run with mu_ held; the analysis cannot see that through the pointer.
  struct Done {
    OrderedWorker* w;
    uint64_t event;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->completed_ >= event; }
  };
  struct Ready {
    OrderedWorker* w;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return w->stop_ || !w->jobs_.empty();
    }
  };

  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    EnterRole(role_);
    const Ready ready{this};
    for (;;) {
      Job job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(&ready));
        if (jobs_.empty()) return;  // stopped and drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      const absl::Status s = run_(job);
      absl::MutexLock lock(&mu_);
      if (!s.ok() && status_.ok()) status_ = s;
      ++completed_;
      idle_since_ns_ = MonotonicNanos();
    }
  }

  const RunFn run_;
  const ThreadRole role_;
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t idle_since_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_ORDERED_WORKER_H_
