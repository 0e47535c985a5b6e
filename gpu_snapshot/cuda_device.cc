// The CUDA device: pinned staging with cudaHostAlloc, copies with cudaMemcpyAsync on
// non-blocking streams created with priorities, CUDA events. Built only with CUDA
// (GRADSNAP_HAVE_CUDA); links the CUDA runtime, never libcuda.
#include <cstring>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

// The one place a cudaError_t becomes a Status.
absl::Status CudaError(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", cudaGetErrorString(err), " (", file, ":", line, ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}
#define GS_CUDA(expr) CudaError((expr), #expr, __FILE__, __LINE__)

class CudaEvent : public CopyEvent {
 public:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  bool Done() override { return cudaEventQuery(event_) == cudaSuccess; }
  absl::Status Wait() override { return GS_CUDA(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_;
};

class CudaStream : public CopyStream {
 public:
  CudaStream(int device, cudaStream_t s) : device_(device), stream_(s) {}
  ~CudaStream() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t n) override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(device_)));
    return GS_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_));
  }
  absl::StatusOr<std::unique_ptr<CopyEvent>> RecordEvent() override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(device_)));
    cudaEvent_t e;
    RETURN_IF_ERROR(GS_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    absl::Status s = GS_CUDA(cudaEventRecord(e, stream_));
    if (!s.ok()) {
      cudaEventDestroy(e);
      return s;
    }
    return std::unique_ptr<CopyEvent>(new CudaEvent(e));
  }
  absl::Status WaitForComputeStream(void* native_stream) override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(device_)));
    cudaEvent_t e;
    RETURN_IF_ERROR(GS_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    absl::Status s = GS_CUDA(cudaEventRecord(e, static_cast<cudaStream_t>(native_stream)));
    if (s.ok()) s = GS_CUDA(cudaStreamWaitEvent(stream_, e, 0));
    cudaEventDestroy(e);  // destruction is deferred by the runtime until the event completes
    return s;
  }
  absl::Status Synchronize() override { return GS_CUDA(cudaStreamSynchronize(stream_)); }

 private:
  int device_;
  cudaStream_t stream_;
};

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}
  std::string Name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool IsHost() const override { return false; }
  absl::StatusOr<void*> AllocPinned(size_t bytes) override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(ordinal_)));
    void* p = nullptr;
    RETURN_IF_ERROR(GS_CUDA(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable)));
    std::memset(p, 0, bytes);  // pre-touch
    return p;
  }
  void FreePinned(void* p, size_t) override { cudaFreeHost(p); }
  absl::StatusOr<std::unique_ptr<CopyStream>> NewStream(bool high_priority) override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(ordinal_)));
    int least = 0, greatest = 0;
    RETURN_IF_ERROR(GS_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest)));
    cudaStream_t s;
    RETURN_IF_ERROR(GS_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking,
                                                         high_priority ? greatest : least)));
    return std::unique_ptr<CopyStream>(new CudaStream(ordinal_, s));
  }
  absl::StatusOr<void*> AllocDevice(size_t bytes) override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(ordinal_)));
    void* p = nullptr;
    RETURN_IF_ERROR(GS_CUDA(cudaMalloc(&p, bytes == 0 ? 1 : bytes)));
    return p;
  }
  void FreeDevice(void* p) override { cudaFree(p); }
  absl::Status CopyToDeviceSync(void* dst, const void* src, size_t n) override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(ordinal_)));
    return GS_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
  }
  absl::Status CopyToHostSync(void* dst, const void* src, size_t n) override {
    RETURN_IF_ERROR(GS_CUDA(cudaSetDevice(ordinal_)));
    return GS_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  }

 private:
  int ordinal_;
};

}  // namespace

bool CudaCompiledIn() { return true; }

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", cudaGetErrorString(err)));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device ", ordinal, " (", count, " present)"));
  }
  return std::unique_ptr<Device>(new CudaDevice(ordinal));
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
