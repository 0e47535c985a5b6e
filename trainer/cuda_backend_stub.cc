// NewCudaBackend in builds without CUDA.
#include "trainer/backend.h"

namespace gradsnap {
namespace trainer {

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(const ModelConfig&, int, int, Comm*) {
  return absl::UnimplementedError(
      "--device cuda: this gradsnap-train was built without CUDA (rebuild with nvcc installed)");
}

}  // namespace trainer
}  // namespace gradsnap
