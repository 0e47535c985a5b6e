#include "trainer/device_copy.h"

#include <cstring>

#if defined(GRADSNAP_HAVE_CUDA)
#include "common/cuda_status.h"
#endif

namespace gradsnap {
namespace trainer {

absl::Status CopyToHost(void* dst, const void* src, size_t bytes, bool on_device) {
  if (!on_device) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
#if defined(GRADSNAP_HAVE_CUDA)
  return GS_CUDA_STATUS(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
#else
  return absl::UnimplementedError("device memory in a build without CUDA");
#endif
}

}  // namespace trainer
}  // namespace gradsnap
