// A prioritized device-to-host copy queue.
//
// OVERVIEW
//   Requests are cut into chunks (a few MiB) and fed to two device streams, one per priority,
//   by one dispatcher thread that keeps at most `depth` chunks in flight. Whenever a chunk
//   slot frees, the next chunk comes from the oldest pending request of the highest priority:
//   a gradient copy submitted while a state block is being copied overtakes the block's
//   remaining chunks (gradients must leave the device before the next backward overwrites
//   them). Each request supplies its host destination per chunk (so chunks can land in pooled
//   staging buffers; the callback may block until one is free) and a callback run after each
//   chunk lands (the host replay is fed from there).
//
// ERRORS
//   The first copy error is sticky: later Waits return it and the queue accepts no more work.
//
// THREAD SAFETY
//   Thread-safe. Callbacks run on the dispatcher thread and must not call Wait on this queue.
#ifndef GRADSNAP_GPU_SNAPSHOT_COPY_QUEUE_H_
#define GRADSNAP_GPU_SNAPSHOT_COPY_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu_snapshot/device.h"
#include "gpu_snapshot/trace.h"

namespace gradsnap {
namespace gpu_snapshot {

enum class CopyPriority : int { kGradient = 0, kState = 1 };
constexpr int kNumPriorities = 2;

struct CopyRequest {
  CopyPriority priority = CopyPriority::kState;
  const void* src = nullptr;  // device memory
  size_t bytes = 0;
  // Host destination of bytes [offset, offset + n) of the request.
  std::function<void*(size_t offset, size_t n)> dst;
  // After bytes [offset, offset + n) landed at `dst`. Optional.
  std::function<void(size_t offset, size_t n, void* dst)> on_chunk;
  std::string label = "copy";  // trace event name
  // When set, the copy starts only after this compute-stream event, which the caller recorded
  // (Device::RecordComputeEvent) when it made the request: the data is what the compute
  // stream had produced at that point, however late the first chunk is dispatched.
  std::shared_ptr<ComputeEvent> after = nullptr;
  // Test hook (SnapshotEngineOptions::test_drop_wait = kReplay): on_chunk runs as soon as a
  // chunk is enqueued on its stream, without waiting for it to land. Default: false
  bool test_consume_before_landing = false;
};

using CopyTicket = uint64_t;

class CopyQueue {
 public:
  // chunk_bytes Default (in callers): 4 MiB. depth: chunks in flight, >= 1.
  static absl::StatusOr<std::unique_ptr<CopyQueue>> Create(Device* device, size_t chunk_bytes,
                                                           int depth, TraceWriter* trace);
  ~CopyQueue();

  // Enqueues a request; a zero-byte request completes at once.
  CopyTicket Submit(CopyRequest request);
  bool Done(CopyTicket t);
  // Blocks until every chunk of `t` (0: of every request) landed and its callback ran. Demands
  // the requests' copies (CopyStream::Demand) first.
  absl::Status Wait(CopyTicket t);
  // Blocks until the first chunk of `t` was enqueued on its stream (or `t` is done).
  void WaitStarted(CopyTicket t);
  // As Wait(t) but gives up once no chunk of this queue has landed for `stall_limit` (counted
  // from the call or the last landing, whichever is later; InfiniteDuration: never): a copy
  // ordered after device work that never ends (a collective a frozen peer never joins). Returns
  // false then, the copies left queued; true once done, with the queue's status in *status.
  bool WaitUnlessStalled(CopyTicket t, absl::Duration stall_limit, absl::Status* status);

  // Copy bandwidth measured over busy periods, bytes per second (0 before the first chunk).
  double bandwidth() const;
  uint64_t bytes_copied() const;
  size_t chunk_bytes() const { return chunk_bytes_; }

 private:
  struct Request {
    CopyTicket ticket;
    CopyRequest r;
    size_t next_offset = 0;
    size_t chunks_left = 0;
    bool started = false;  // guarded by mu_
    std::atomic<bool> demanded{false};
  };
  struct InFlight {
    std::shared_ptr<Request> req;
    size_t offset, n;
    void* dst;
    std::unique_ptr<CopyEvent> event;
    int64_t submit_us;
  };

  CopyQueue(size_t chunk_bytes, int depth, TraceWriter* trace)
      : chunk_bytes_(chunk_bytes), depth_(depth), trace_(trace) {}
  void Run();
  std::shared_ptr<Request> NextChunkSource() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Launch(const std::shared_ptr<Request>& req, std::deque<InFlight>* inflight);
  void Land(InFlight* f);
  // Marks the open request `t` and the earlier ones of its priority (or all, t == 0) demanded
  // and demands their streams' copies.
  void Demand(CopyTicket t) ABSL_LOCKS_EXCLUDED(mu_, demand_mu_);

  // Constant after construction.
  const size_t chunk_bytes_;
  const int depth_;
  TraceWriter* const trace_;
  std::unique_ptr<CopyStream> streams_[kNumPriorities];
  std::thread thread_;

  // Orders a chunk's enqueue with a Demand of its request (Demand, Run).
  absl::Mutex demand_mu_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Request>> pending_[kNumPriorities] ABSL_GUARDED_BY(mu_);
  std::map<CopyTicket, std::shared_ptr<Request>> open_ ABSL_GUARDED_BY(mu_);
  CopyTicket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t busy_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_land_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_COPY_QUEUE_H_
