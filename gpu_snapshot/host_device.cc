// The host-memory device: "device memory" is host memory; each stream copies on its own thread.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/huge_map.h"
#include "common/status.h"
#include "gpu_snapshot/device.h"
#include "gpu_snapshot/worker_stream.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

constexpr size_t kAlign = 4096;

struct HostCopy {
  void* dst;
  const void* src;
  size_t n;
};

// A FIFO of memcpy jobs drained by one thread.
class HostStream : public WorkerCopyStream<HostCopy> {
 public:
  HostStream() : WorkerCopyStream(&Copy) {}

  absl::Status CopyToHost(void* dst, const void* src, size_t n) override {
    return jobs_.Enqueue({dst, src, n});
  }
  absl::Status WaitForEvent(ComputeEvent*) override { return absl::OkStatus(); }

 private:
  static absl::Status Copy(const HostCopy& job) {
    std::memcpy(job.dst, job.src, job.n);
    return absl::OkStatus();
  }
};

void* AlignedTouched(size_t bytes) {
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p != nullptr) std::memset(p, 0, rounded);  // pre-touch every page
  return p;
}

// Staging buffers: the big ones (a snapshot of the state, the gradient log's buffers, many
// MiB that live for the whole job) on huge pages, faulted in at once (common/huge_map.h).
void* PinnedTouched(size_t bytes) {
  return bytes >= kHugePageSize ? MapHuge(bytes, /*populate=*/true) : AlignedTouched(bytes);
}

void FreeTouched(void* p, size_t bytes) {
  if (bytes >= kHugePageSize) {
    UnmapHuge(p, bytes);
  } else {
    std::free(p);
  }
}

class HostDevice : public Device {
 public:
  std::string Name() const override { return "host"; }
  bool IsHost() const override { return true; }
  absl::StatusOr<void*> AllocPinned(size_t bytes) override {
    void* p = PinnedTouched(bytes);
    if (p == nullptr) return absl::ResourceExhaustedError("host staging allocation failed");
    return p;
  }
  void FreePinned(void* p, size_t bytes) override { FreeTouched(p, bytes); }
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
