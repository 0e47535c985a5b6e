// Internal helpers shared by the client back ends (embedded_client.cc, remote_client.cc):
// resolving the tensor list of a save, a byte budget bounding asynchronous saves, and the
// worker queue that runs them.
#ifndef GRADSNAP_CLIENT_SAVE_UTIL_H_
#define GRADSNAP_CLIENT_SAVE_UTIL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "common/stats.h"

namespace gradsnap {
namespace client {

// The ShardSpec actually saved by SaveShardAsync(spec, tensors): spec.tensors may be left empty
// (it is then filled from the refs' specs in order) or must equal the refs' specs in order.
// Checks names, dtype sizes (product(shape) * DTypeSize == byte_length) and non-null data.
// INVALID_ARGUMENT on any mismatch.
absl::StatusOr<ShardSpec> ResolveShardSpec(const ShardSpec& spec,
                                           const std::vector<TensorRef>& tensors);

// For a save of a shard that the store already holds committed (a restarted attempt persisting
// the same step again): OK when every tensor's SHA-256 equals the stored one (the save is then
// idempotent), ALREADY_EXISTS "conflict: ..." naming the first tensor whose content differs.
absl::Status CheckCommittedContent(const ShardSpec& spec, const ShardInfo& stored,
                                   const std::vector<TensorRef>& tensors);

// Sum of byte_length over a shard's tensors.
uint64_t ShardBytes(const ShardSpec& spec);

// A counting budget of bytes in flight. Acquire(n) blocks while the bytes in flight plus n would
// exceed the limit, except that a request is always admitted when nothing is in flight (so one
// shard larger than the limit still proceeds, alone). Publishes its own gauges in the process's
// Registry, gradsnap_client_inflight_bytes{client="ID"} and
// gradsnap_client_inflight_peak_bytes{client="ID"}, ID unique to the budget (one per Client), so
// several clients in one process never overwrite each other's values. Thread-safe.
class ByteBudget {
 public:
  explicit ByteBudget(uint64_t limit);
  void Acquire(uint64_t n);
  void Release(uint64_t n);
  struct Usage {
    uint64_t in_flight = 0;
    uint64_t peak = 0;  // the highest in_flight seen by this budget
  };
  Usage usage() const;
  // The `client` label of this budget's gauges: 1, 2, ... in the order budgets were made.
  int64_t metrics_id() const { return metrics_id_; }

 private:
  const uint64_t limit_;
  const int64_t metrics_id_;
  mutable absl::Mutex mu_;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  Counter* gauge_;
  Counter* peak_gauge_;
};

// Runs asynchronous shard saves on a fixed set of worker threads, in submission order; each save
// resolves its future with the status `save` returns. Thread-safe. The destructor finishes every
// queued save, then joins the workers, so `save` may use its owner's members until then: destroy
// the queue before them.
class SaveQueue {
 public:
  using SaveFn =
      std::function<absl::Status(const ShardSpec& spec, const std::vector<TensorRef>& tensors)>;
  SaveQueue(size_t workers, SaveFn save);
  ~SaveQueue();
  SaveQueue(const SaveQueue&) = delete;
  SaveQueue& operator=(const SaveQueue&) = delete;

  // Queues the save of `spec` and `tensors` (Client::SaveShardAsync): the spec is resolved
  // with ResolveShardSpec first, and a spec that does not resolve fails the future at once.
  [[nodiscard]] std::future<absl::Status> Push(const ShardSpec& spec,
                                               std::vector<TensorRef> tensors);

 private:
  struct Task {
    ShardSpec spec;
    std::vector<TensorRef> tensors;
    std::promise<absl::Status> done;
  };
  void WorkerLoop();

  const SaveFn save_;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Task>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // last: started after the members above exist
};

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_SAVE_UTIL_H_
