// The wait of a worker thread that drains a queue of jobs (the simulated and host devices'
// streams, the trainer's store sink): under the owner's mutex, sleep until there is a job or the
// owner stops, and take the front job. Jobs queued before the stop still run.
//
// THREAD SAFETY: the caller holds `mu`, which guards `queue` and `stop`.
#ifndef GRADSNAP_COMMON_WORKER_QUEUE_H_
#define GRADSNAP_COMMON_WORKER_QUEUE_H_

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsnap {

// Waits on `mu` until `queue` (a std::deque or alike) is non-empty or `stop` is true, then moves
// the front job into *job and pops it. False when stopped with the queue drained: the worker
// returns.
template <typename Queue, typename Job>
bool AwaitNextJob(absl::Mutex& mu, Queue& queue, const bool& stop, Job* job)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  struct Ready {
    const Queue* queue;
    const bool* stop;
    // Evaluated by Await with `mu` held; the analysis cannot see that through the pointers.
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return *stop || !queue->empty(); }
  };
  const Ready ready{&queue, &stop};
  mu.Await(absl::Condition(&ready));
  if (queue.empty()) return false;
  *job = std::move(queue.front());
  queue.pop_front();
  return true;
}

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_WORKER_QUEUE_H_
