// NewCudaBackend in builds without CUDA.
#include "trainer/backend.h"
#include "trainer/cuda_testing.h"

namespace gradsnap {
namespace trainer {

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(const ModelConfig&, int, int, Comm*,
                                                        int, std::chrono::milliseconds) {
  return absl::UnimplementedError(
      "--device cuda: this gradsnap-train was built without CUDA (rebuild with nvcc installed)");
}

absl::Status DeviceAdamWForTest(float*, float*, float*, const uint16_t*, size_t,
                                const AdamWStepParams&) {
  return absl::UnimplementedError("built without CUDA");
}

absl::Status NcclDeadlineForTest(std::chrono::milliseconds, bool, bool* aborted) {
  *aborted = false;
  return absl::UnimplementedError("built without CUDA");
}

}  // namespace trainer
}  // namespace gradsnap
