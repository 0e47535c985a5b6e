#include "gpu_snapshot/device_kind.h"

#include "absl/status/status.h"

namespace gradsnap {
namespace gpu_snapshot {

const char* DeviceKindName(DeviceKind d) {
  switch (d) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda";
    case DeviceKind::kSim: return "sim";
  }
  return "?";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name) {
  for (DeviceKind d : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kSim}) {
    if (name == DeviceKindName(d)) return d;
  }
  return absl::InvalidArgumentError("--device must be cpu, cuda or sim");
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
