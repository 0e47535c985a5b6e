// The CUDA device: pinned staging with cudaHostAlloc, copies with cudaMemcpyAsync on
// non-blocking streams created with priorities, CUDA events. Built only with CUDA
// (GRADSNAP_HAVE_CUDA); links the CUDA runtime, never libcuda.
//
// The current device is per host thread, and the engine calls in here from the training thread
// and from its copy thread: every call that touches the runtime runs under a DeviceGuard that
// makes this device current and restores the caller's device on the way out.
#include <cstring>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

// Makes `ordinal` the calling thread's current device; restores the previous one on exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    status_ = GS_CUDA_STATUS(cudaGetDevice(&prev_));
    if (status_.ok() && prev_ != ordinal) status_ = GS_CUDA_STATUS(cudaSetDevice(ordinal));
    if (!status_.ok()) prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int prev_ = -1;
  absl::Status status_;
};
#define GS_DEVICE_GUARD(ordinal)        \
  DeviceGuard guard_(ordinal);          \
  RETURN_IF_ERROR(guard_.status())

// Runs `call` (returning a Status) with device `ordinal` current.
template <typename Call>
absl::Status OnDevice(int ordinal, Call call) {
  GS_DEVICE_GUARD(ordinal);
  return call();
}

// The Status of the CUDA runtime call `expr` made with device `ordinal` current: most methods
// below are this one line.
#define GS_CUDA_STATUS_ON(ordinal, expr) OnDevice(ordinal, [&] { return GS_CUDA_STATUS(expr); })

// A new event (without timing) recorded on `stream`; the caller owns it. The caller holds a
// DeviceGuard.
absl::StatusOr<cudaEvent_t> NewRecordedEvent(cudaStream_t stream) {
  cudaEvent_t e;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  absl::Status s = GS_CUDA_STATUS(cudaEventRecord(e, stream));
  if (!s.ok()) {
    cudaEventDestroy(e);
    return s;
  }
  return e;
}

// A CUDA event or stream of device `device`, destroyed with that device current (the runtime
// defers an event's destruction until it completed, a stream's until its work finished).
template <typename Handle, cudaError_t (*kDestroy)(Handle)>
class DeviceHandle {
 public:
  DeviceHandle(int device, Handle handle) : device_(device), handle_(handle) {}
  ~DeviceHandle() {
    DeviceGuard g(device_);
    kDestroy(handle_);
  }
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;
  int device() const { return device_; }
  Handle get() const { return handle_; }

 private:
  int device_;
  Handle handle_;
};
using EventHandle = DeviceHandle<cudaEvent_t, cudaEventDestroy>;
using StreamHandle = DeviceHandle<cudaStream_t, cudaStreamDestroy>;

class CudaComputeEvent : public ComputeEvent {
 public:
  CudaComputeEvent(int device, cudaEvent_t e) : event_(device, e) {}
  cudaEvent_t get() const { return event_.get(); }

 private:
  EventHandle event_;
};

class CudaEvent : public CopyEvent {
 public:
  CudaEvent(int device, cudaEvent_t e) : event_(device, e) {}
  bool Done() override {
    DeviceGuard g(event_.device());
    return cudaEventQuery(event_.get()) == cudaSuccess;
  }
  absl::Status Wait() override {
    return GS_CUDA_STATUS_ON(event_.device(), cudaEventSynchronize(event_.get()));
  }

 private:
  EventHandle event_;
};

class CudaStream : public CopyStream {
 public:
  CudaStream(int device, cudaStream_t s) : stream_(device, s) {}
  // Every copy lands before the stream goes (the caller frees the staging it writes next).
  ~CudaStream() override { Synchronize().IgnoreError(); }
  absl::Status CopyToHost(void* dst, const void* src, size_t n) override {
    return GS_CUDA_STATUS_ON(
        stream_.device(), cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_.get()));
  }
  absl::StatusOr<std::unique_ptr<CopyEvent>> RecordEvent() override {
    GS_DEVICE_GUARD(stream_.device());
    ASSIGN_OR_RETURN(cudaEvent_t e, NewRecordedEvent(stream_.get()));
    return std::unique_ptr<CopyEvent>(new CudaEvent(stream_.device(), e));
  }
  absl::Status WaitForEvent(ComputeEvent* event) override {
    if (event == nullptr) return absl::OkStatus();
    const cudaEvent_t e = static_cast<CudaComputeEvent*>(event)->get();
    return GS_CUDA_STATUS_ON(stream_.device(), cudaStreamWaitEvent(stream_.get(), e, 0));
  }
  absl::Status Synchronize() override {
    return GS_CUDA_STATUS_ON(stream_.device(), cudaStreamSynchronize(stream_.get()));
  }

 private:
  StreamHandle stream_;
};

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}
  std::string Name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool IsHost() const override { return false; }
  absl::StatusOr<void*> AllocPinned(size_t bytes) override {
    GS_DEVICE_GUARD(ordinal_);
    void* p = nullptr;
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable));
    std::memset(p, 0, bytes);  // pre-touch
    return p;
  }
  void FreePinned(void* p, size_t) override {
    DeviceGuard g(ordinal_);
    cudaFreeHost(p);
  }
  absl::StatusOr<std::unique_ptr<CopyStream>> NewStream(bool high_priority) override {
    GS_DEVICE_GUARD(ordinal_);
    int least = 0, greatest = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking,
                                                      high_priority ? greatest : least));
    return std::unique_ptr<CopyStream>(new CudaStream(ordinal_, s));
  }
  absl::StatusOr<std::shared_ptr<ComputeEvent>> RecordComputeEvent(void* native_stream) override {
    if (native_stream == nullptr) return std::shared_ptr<ComputeEvent>();
    GS_DEVICE_GUARD(ordinal_);
    ASSIGN_OR_RETURN(cudaEvent_t e, NewRecordedEvent(static_cast<cudaStream_t>(native_stream)));
    return std::shared_ptr<ComputeEvent>(new CudaComputeEvent(ordinal_, e));
  }
  absl::StatusOr<void*> AllocDevice(size_t bytes) override {
    GS_DEVICE_GUARD(ordinal_);
    void* p = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    return p;
  }
  void FreeDevice(void* p) override {
    DeviceGuard g(ordinal_);
    cudaFree(p);
  }
  absl::Status CopyToDeviceSync(void* dst, const void* src, size_t n) override {
    return GS_CUDA_STATUS_ON(ordinal_, cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
  }
  absl::Status CopyToHostSync(void* dst, const void* src, size_t n) override {
    return GS_CUDA_STATUS_ON(ordinal_, cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  }

 private:
  int ordinal_;
};

}  // namespace

bool CudaCompiledIn() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return 0;
  RETURN_IF_ERROR(CudaStatus(err, "cudaGetDeviceCount", __FILE__, __LINE__));
  return count;
}

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal) {
  RETURN_IF_ERROR(CheckCudaOrdinal(ordinal));
  return std::unique_ptr<Device>(new CudaDevice(ordinal));
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
