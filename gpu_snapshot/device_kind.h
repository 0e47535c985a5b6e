// The kind of device a rank computes on and snapshots from (--device, docs/trainer.md): the one
// enum the trainer's back ends, its state views and CheckDevices (device.h) share. Strings exist
// only at the flag boundary (ParseDeviceKind) and in output (DeviceKindName).
#ifndef GRADSNAP_GPU_SNAPSHOT_DEVICE_KIND_H_
#define GRADSNAP_GPU_SNAPSHOT_DEVICE_KIND_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {
namespace gpu_snapshot {

// The host CPU, a CUDA GPU, or the simulated asynchronous GPU (sim_device.h).
enum class DeviceKind { kCpu, kCuda, kSim };

// "cpu", "cuda" or "sim".
const char* DeviceKindName(DeviceKind d);
// The inverse of DeviceKindName; INVALID_ARGUMENT "--device must be cpu, cuda or sim" for any
// other string.
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_DEVICE_KIND_H_
