// The device behind the snapshot engine (DESIGN.md section 4): buffers, copy streams, events.
//
// OVERVIEW
//   The snapshot engine copies the rank's training state and gradients from "device memory" to
//   pinned host staging buffers on side streams, overlapped with compute. Two implementations:
//     - the host device (NewHostDevice): device memory is ordinary host memory (the CPU
//       trainer's state); every stream runs its copies on its own thread, so every schedule of
//       the engine runs in tests without a GPU;
//     - the CUDA device (NewCudaDevice, only when built with CUDA): cudaHostAlloc'ed pinned
//       staging, cudaMemcpyAsync on non-blocking streams created with priorities, CUDA events.
//   Copies are asynchronous: CopyToHost enqueues, RecordEvent marks a point in the stream, and
//   the event's Wait blocks until every copy enqueued before it has landed.
//
// THREAD SAFETY
//   Device is thread-safe. A CopyStream and its events are used by one thread at a time.
#ifndef GRADSNAP_GPU_SNAPSHOT_DEVICE_H_
#define GRADSNAP_GPU_SNAPSHOT_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsnap {
namespace gpu_snapshot {

// A point in a stream. Done/Wait report the first copy error of the stream, if any.
class CopyEvent {
 public:
  virtual ~CopyEvent() = default;
  // True once every copy enqueued before the event has landed.
  virtual bool Done() = 0;
  // Blocks until Done().
  virtual absl::Status Wait() = 0;
};

// An in-order queue of device-to-host copies.
class CopyStream {
 public:
  virtual ~CopyStream() = default;
  // Enqueues a copy of n bytes from device memory `src` to host memory `dst`.
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t n) = 0;
  // Marks the current end of the stream.
  virtual absl::StatusOr<std::unique_ptr<CopyEvent>> RecordEvent() = 0;
  // Later copies start only after the work enqueued so far on the trainer's compute stream
  // (a cudaStream_t on CUDA; ignored on the host device, whose compute is synchronous).
  virtual absl::Status WaitForComputeStream(void* native_stream) = 0;
  // Blocks until every enqueued copy has landed.
  virtual absl::Status Synchronize() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string Name() const = 0;
  // True when device memory is host memory (the CPU trainer).
  virtual bool IsHost() const = 0;
  // Page-locked host memory for staging, pre-touched (every page written once) so copies into
  // it run at full speed from the first checkpoint. RESOURCE_EXHAUSTED when it cannot be had.
  virtual absl::StatusOr<void*> AllocPinned(size_t bytes) = 0;
  virtual void FreePinned(void* p, size_t bytes) = 0;
  // A copy stream; high-priority streams are scheduled first by the hardware where it can.
  virtual absl::StatusOr<std::unique_ptr<CopyStream>> NewStream(bool high_priority) = 0;
  // Device memory and blocking host-to-device copies, for tests and restore.
  virtual absl::StatusOr<void*> AllocDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* p) = 0;
  virtual absl::Status CopyToDeviceSync(void* dst, const void* src, size_t n) = 0;
  virtual absl::Status CopyToHostSync(void* dst, const void* src, size_t n) = 0;
};

// The host-memory device. Never fails.
std::unique_ptr<Device> NewHostDevice();

// The CUDA device `ordinal`. UNIMPLEMENTED when gradsnap was built without CUDA;
// FAILED_PRECONDITION ("no CUDA device: ...") when the runtime finds no usable device.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal);

// True when this build includes the CUDA device.
bool CudaCompiledIn();

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_DEVICE_H_
