// CUDA helpers of the trainer: the CUDA/cuBLAS error-to-Status conversion and a device array
// that frees itself. Only included by .cu files. Thread safety: DeviceArray is not shared.
#ifndef GRADSNAP_TRAINER_CUDA_UTIL_H_
#define GRADSNAP_TRAINER_CUDA_UTIL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace trainer {

// The one place per error source where CUDA, cuBLAS and NCCL errors become a Status.
inline absl::Status CudaError(cudaError_t e, const char* file, int line) {
  return absl::InternalError(absl::StrCat("CUDA error at ", file, ":", line, ": ",
                                          cudaGetErrorString(e)));
}
#define CUDA_RETURN(expr)                                               \
  do {                                                                  \
    cudaError_t e_ = (expr);                                            \
    if (e_ != cudaSuccess) return CudaError(e_, __FILE__, __LINE__);    \
  } while (0)
#define CUBLAS_RETURN(expr)                                                              \
  do {                                                                                   \
    cublasStatus_t s_ = (expr);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      return absl::InternalError(absl::StrCat("cuBLAS error ", static_cast<int>(s_),    \
                                              " at ", __FILE__, ":", __LINE__));         \
    }                                                                                    \
  } while (0)

// FAILED_PRECONDITION only when the runtime reports no device or no driver; any other error of
// cudaGetDeviceCount is INTERNAL (a broken GPU is not "no GPU").
inline absl::Status RequireDevice() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
      (e == cudaSuccess && count == 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device cuda: no CUDA device available (cudaGetDeviceCount: ",
        e == cudaSuccess ? "0 devices" : cudaGetErrorString(e), ")"));
  }
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("--device cuda: cudaGetDeviceCount: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
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
    CUDA_RETURN(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    CUDA_RETURN(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)));
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
