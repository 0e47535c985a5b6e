// The copy stream of the host and simulated devices: its jobs (copies, and on sim compute-event
// waits) run in order on an OrderedWorker, and an event is the worker's event number when it
// was recorded.
//
// THREAD SAFETY: as CopyStream. The run function must not use the derived stream's members
// (the worker drains its queue after they are gone); capture the device instead.
#ifndef GRADSNAP_GPU_SNAPSHOT_WORKER_STREAM_H_
#define GRADSNAP_GPU_SNAPSHOT_WORKER_STREAM_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ordered_worker.h"
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace gpu_snapshot {

template <typename Job>
class WorkerCopyStream : public CopyStream {
 public:
  explicit WorkerCopyStream(typename OrderedWorker<Job>::RunFn run)
      : jobs_(std::move(run), ThreadRole::kCopy) {}

  absl::StatusOr<std::unique_ptr<CopyEvent>> RecordEvent() override {
    return std::unique_ptr<CopyEvent>(new Event(&jobs_));
  }
  // The stream's first error (a failed copy or wait), as a CUDA stream reports it.
  absl::Status Synchronize() override { return jobs_.Synchronize(); }

 protected:
  OrderedWorker<Job> jobs_;

 private:
  class Event : public CopyEvent {
   public:
    explicit Event(OrderedWorker<Job>* jobs) : jobs_(jobs), event_(jobs->Record()) {}
    bool Done() override { return jobs_->Reached(event_); }
    absl::Status Wait() override { return jobs_->Wait(event_); }

   private:
    OrderedWorker<Job>* const jobs_;  // a stream outlives its events
    const uint64_t event_;
  };
};

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_WORKER_STREAM_H_
