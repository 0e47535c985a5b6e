#include "trainer/device_copy.h"

#include <cstring>

#include "absl/strings/str_cat.h"

#if defined(GRADSNAP_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gradsnap {
namespace trainer {

absl::Status CopyToHost(void* dst, const void* src, size_t bytes, bool on_device) {
  if (!on_device) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
#if defined(GRADSNAP_HAVE_CUDA)
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemcpy: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
#else
  return absl::UnimplementedError("device memory in a build without CUDA");
#endif
}

}  // namespace trainer
}  // namespace gradsnap
