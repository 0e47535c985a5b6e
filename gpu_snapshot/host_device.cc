// The host-memory device: "device memory" is host memory; each stream copies on its own thread.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/worker_queue.h"
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

constexpr size_t kAlign = 4096;

// A FIFO of memcpy jobs drained by one thread. Events are sequence numbers.
class HostStream : public CopyStream {
 public:
  HostStream() : thread_([this] { Run(); }) {}
  ~HostStream() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t n) override {
    absl::MutexLock lock(&mu_);
    jobs_.push_back({dst, src, n});
    ++enqueued_;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<CopyEvent>> RecordEvent() override;

  absl::Status WaitForEvent(ComputeEvent*) override { return absl::OkStatus(); }

  absl::Status Synchronize() override {
    uint64_t target;
    {
      absl::MutexLock lock(&mu_);
      target = enqueued_;
    }
    WaitFor(target);
    return absl::OkStatus();
  }

  bool Reached(uint64_t seq) {
    absl::MutexLock lock(&mu_);
    return completed_ >= seq;
  }
  void WaitFor(uint64_t seq) {
    std::pair<HostStream*, uint64_t> arg{this, seq};
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::pair<HostStream*, uint64_t>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return a->first->completed_ >= a->second;
        },
        &arg));
  }

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t n;
  };

  void Run() {
    for (;;) {
      Job job;
      {
        absl::MutexLock lock(&mu_);
        if (!AwaitNextJob(mu_, jobs_, stop_, &job)) return;  // stopped and drained
      }
      std::memcpy(job.dst, job.src, job.n);
      absl::MutexLock lock(&mu_);
      ++completed_;
    }
  }

  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class HostEvent : public CopyEvent {
 public:
  HostEvent(HostStream* stream, uint64_t seq) : stream_(stream), seq_(seq) {}
  bool Done() override { return stream_->Reached(seq_); }
  absl::Status Wait() override {
    stream_->WaitFor(seq_);
    return absl::OkStatus();
  }

 private:
  HostStream* stream_;
  uint64_t seq_;
};

absl::StatusOr<std::unique_ptr<CopyEvent>> HostStream::RecordEvent() {
  absl::MutexLock lock(&mu_);
  return std::unique_ptr<CopyEvent>(new HostEvent(this, enqueued_));
}

void* AlignedTouched(size_t bytes) {
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p != nullptr) std::memset(p, 0, rounded);  // pre-touch every page
  return p;
}

class HostDevice : public Device {
 public:
  std::string Name() const override { return "host"; }
  bool IsHost() const override { return true; }
  absl::StatusOr<void*> AllocPinned(size_t bytes) override {
    void* p = AlignedTouched(bytes);
    if (p == nullptr) return absl::ResourceExhaustedError("host staging allocation failed");
    return p;
  }
  void FreePinned(void* p, size_t) override { std::free(p); }
  absl::StatusOr<std::unique_ptr<CopyStream>> NewStream(bool) override {
    return std::unique_ptr<CopyStream>(new HostStream());
  }
  absl::StatusOr<std::shared_ptr<ComputeEvent>> RecordComputeEvent(void*) override {
    return std::shared_ptr<ComputeEvent>();  // compute is synchronous
  }
  absl::StatusOr<void*> AllocDevice(size_t bytes) override {
    void* p = AlignedTouched(bytes);
    if (p == nullptr) return absl::ResourceExhaustedError("host device allocation failed");
    return p;
  }
  void FreeDevice(void* p) override { std::free(p); }
  absl::Status CopyToDeviceSync(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status CopyToHostSync(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Device> NewHostDevice() { return std::make_unique<HostDevice>(); }

}  // namespace gpu_snapshot
}  // namespace gradsnap
