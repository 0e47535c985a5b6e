// The device behind the snapshot engine (DESIGN.md section 4): buffers, copy streams, events.
//
// OVERVIEW
//   The snapshot engine copies the rank's training state and gradients from "device memory" to
//   pinned host staging buffers on side streams, overlapped with compute. Three implementations:
//     - the host device (NewHostDevice): device memory is ordinary host memory (the CPU
//       trainer's state, whose compute is synchronous); every stream runs its copies on its own
//       thread, so every schedule of the engine runs in tests without a GPU;
//     - the simulated asynchronous device (NewSimDevice, sim_device.h): kernels run on a
//       compute-stream thread, copies honour compute events and a throttled copy engine;
//     - the CUDA device (NewCudaDevice, only when built with CUDA): cudaHostAlloc'ed pinned
//       staging, cudaMemcpyAsync on non-blocking streams created with priorities, CUDA events.
//       Every call makes the device current for its duration and restores the caller's.
//   Copies are asynchronous: CopyToHost enqueues, RecordEvent marks a point in the stream, and
//   the event's Wait blocks until every copy enqueued before it has landed. A copy of data that
//   the trainer's compute stream produces is ordered after it by a ComputeEvent, recorded on the
//   training thread when the copy is requested (RecordComputeEvent) and waited for by the copy
//   stream (WaitForEvent) before the copy's first byte moves.
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
#include "gpu_snapshot/device_kind.h"

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

// A point in the trainer's compute stream (a cudaEvent_t on CUDA). Opaque; shared by the copies
// that wait for it.
class ComputeEvent {
 public:
  virtual ~ComputeEvent() = default;
};

// An in-order queue of device-to-host copies.
class CopyStream {
 public:
  virtual ~CopyStream() = default;
  // Enqueues a copy of n bytes from device memory `src` to host memory `dst`.
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t n) = 0;
  // Marks the current end of the stream.
  virtual absl::StatusOr<std::unique_ptr<CopyEvent>> RecordEvent() = 0;
  // Later copies start only after `event` completed (null: no wait).
  virtual absl::Status WaitForEvent(ComputeEvent* event) = 0;
  // Blocks until every enqueued copy has landed.
  virtual absl::Status Synchronize() = 0;
  // A hint: the host is about to block until every copy enqueued so far has landed. Only the
  // simulated device's late_copies test mode uses it (a GPU starts copies on its own). Default:
  // nothing.
  virtual void Demand() {}
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
  // Records an event after the work enqueued so far on the trainer's compute stream
  // `native_stream` (a cudaStream_t on CUDA, the simulated compute stream on sim), on the calling
  // thread. Returns null when there is nothing to wait for (the host device; a null stream).
  virtual absl::StatusOr<std::shared_ptr<ComputeEvent>> RecordComputeEvent(void* native_stream) = 0;
  // Device memory and blocking host-to-device copies, for tests and restore.
  virtual absl::StatusOr<void*> AllocDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* p) = 0;
  virtual absl::Status CopyToDeviceSync(void* dst, const void* src, size_t n) = 0;
  virtual absl::Status CopyToHostSync(void* dst, const void* src, size_t n) = 0;
};

// The host-memory device. Never fails.
std::unique_ptr<Device> NewHostDevice();

// The CUDA device `ordinal`. UNIMPLEMENTED when gradsnap was built without CUDA;
// FAILED_PRECONDITION ("no CUDA device: ...") when the runtime reports no device or no driver;
// INVALID_ARGUMENT when `ordinal` is not one of the devices present; INTERNAL for any other
// runtime error (a broken GPU is not "no GPU").
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal);

// The number of CUDA devices: 0 when the runtime reports no device or no driver (or the build
// has no CUDA); INTERNAL for any other error.
absl::StatusOr<int> CudaDeviceCount();

// The number of CUDA devices, at least one: FAILED_PRECONDITION ("no CUDA device or driver
// ...") when the runtime reports none (or the build has no CUDA), INTERNAL for any other error.
absl::StatusOr<int> CudaDevicesPresent();
// OK when CUDA device `ordinal` is present; CudaDevicesPresent's errors, or INVALID_ARGUMENT
// ("CUDA device N does not exist (M present)").
absl::Status CheckCudaOrdinal(int ordinal);

// True when this build includes the CUDA device.
bool CudaCompiledIn();

// Checks the command-line choice of devices: `kind` and the device ordinals [first, first +
// count) of one node's ranks. kCpu always passes. INVALID_ARGUMENT for ordinals beyond the
// devices present ("--device_id 7 with 2 ranks needs sim devices 7..8; 8 present");
// UNIMPLEMENTED for cuda in a build without CUDA;
// FAILED_PRECONDITION when there is no CUDA device or driver; INTERNAL for other runtime errors.
// Messages name the flags (--device, --device_id).
absl::Status CheckDevices(DeviceKind kind, int first, int count);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_DEVICE_H_
