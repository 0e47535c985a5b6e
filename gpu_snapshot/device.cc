// CheckDevices: the device kinds and how many of each a process can open.
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_snapshot/device.h"
#include "gpu_snapshot/sim_device.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

// How many devices of `kind` (kSim or kCuda) this process can open.
absl::StatusOr<int> DevicesPresent(DeviceKind kind) {
  if (kind == DeviceKind::kSim) return kSimDeviceCount;
  if (!CudaCompiledIn()) return absl::UnimplementedError("--device cuda: this build has no CUDA");
  absl::StatusOr<int> n = CudaDevicesPresent();
  if (!n.ok()) return Annotate(n.status(), "--device cuda");
  return *n;
}

}  // namespace

absl::StatusOr<int> CudaDevicesPresent() {
  ASSIGN_OR_RETURN(const int n, CudaDeviceCount());
  if (n == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device or driver (cudaGetDeviceCount reports none)");
  }
  return n;
}

absl::Status CheckCudaOrdinal(int ordinal) {
  ASSIGN_OR_RETURN(const int n, CudaDevicesPresent());
  if (ordinal < 0 || ordinal >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist (", n, " present)"));
  }
  return absl::OkStatus();
}

absl::Status CheckDevices(DeviceKind kind, int first, int count) {
  if (kind == DeviceKind::kCpu) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int present, DevicesPresent(kind));
  if (first < 0 || count < 1 || first > present - count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device_id ", first, " with ", count, count == 1 ? " rank" : " ranks", " needs ", DeviceKindName(kind),
        " devices ", first, "..", first + count - 1, "; ", present, " present"));
  }
  return absl::OkStatus();
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
