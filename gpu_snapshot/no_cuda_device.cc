// Builds without CUDA: the CUDA device reports that it is not compiled in.
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace gpu_snapshot {

bool CudaCompiledIn() { return false; }

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int) {
  return absl::UnimplementedError("gradsnap was built without CUDA (GRADSNAP_HAVE_CUDA off)");
}

absl::StatusOr<int> CudaDeviceCount() { return 0; }

}  // namespace gpu_snapshot
}  // namespace gradsnap
