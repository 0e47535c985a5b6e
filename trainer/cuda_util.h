// CUDA helpers of the trainer: the cuBLAS error-to-Status conversion (CUDA runtime errors go
// through common/cuda_status.h), the device check and a device array that frees itself. Only
// included by .cu files. Thread safety: DeviceArray is not shared.
#ifndef GRADSNAP_TRAINER_CUDA_UTIL_H_
#define GRADSNAP_TRAINER_CUDA_UTIL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace trainer {

// OK for CUBLAS_STATUS_SUCCESS, else INTERNAL "cuBLAS error <n> in <where>".
inline absl::Status CublasStatus(cublasStatus_t s, absl::string_view where) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error ", static_cast<int>(s), " in ", where));
}
#define CUBLAS_RETURN(expr) RETURN_IF_ERROR(CublasStatus((expr), #expr))

// FAILED_PRECONDITION only when the runtime reports no device or no driver; any other error of
// cudaGetDeviceCount is INTERNAL (a broken GPU is not "no GPU").
inline absl::Status RequireDevice() {
  return Annotate(gpu_snapshot::CudaDevicesPresent().status(), "--device cuda");
}

// A device array that frees itself.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (p_ != nullptr) cudaFree(p_);
  }
  absl::Status Alloc(size_t n) {
    n_ = n;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    CUDA_RETURN_IF_ERROR(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)));
    return absl::OkStatus();
  }
  void Swap(DeviceArray& o) {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CUDA_UTIL_H_
