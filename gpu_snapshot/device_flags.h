// The device flags, defined once for the binaries that choose the trainer's device:
// gradsnap-train, and snapshot_bench, which passes them on to it. One definition keeps their
// spellings, defaults, --help text and checks the same. Target gradsnap::device_flags: only
// binaries link it (the libraries take DeviceKind and ordinals, never flags).
//
//   --device         cpu, cuda or sim (the simulated asynchronous GPU). Default: cpu
//   --device_id      cuda/sim: the first device of this node's ranks. Default: 0
//   --sim_copy_gbps  sim: copy bandwidth of the simulated copy engine, GB/s (> 0). Default: 0.4
//
// THREAD SAFETY: read after the command line is parsed, like any Abseil flag.
#ifndef GRADSNAP_GPU_SNAPSHOT_DEVICE_FLAGS_H_
#define GRADSNAP_GPU_SNAPSHOT_DEVICE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_snapshot/device_kind.h"

ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int, device_id);
ABSL_DECLARE_FLAG(double, sim_copy_gbps);

namespace gradsnap {
namespace gpu_snapshot {

// --device parsed (ParseDeviceKind): the one place its string is read.
absl::StatusOr<DeviceKind> DeviceFlag();

// The flags' choice checked for `ranks` ranks on this node: DeviceFlag()'s error for an unknown
// --device, INVALID_ARGUMENT "--sim_copy_gbps must be > 0" with --device sim, else
// CheckDevices(--device, --device_id, ranks) (device.h).
absl::Status CheckDeviceFlags(int ranks);

// The flags as gradsnap-train arguments: --device=, --device_id= and, with --device sim,
// --sim_copy_gbps=. --device is passed on as given.
std::vector<std::string> DeviceFlagArgs();

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_DEVICE_FLAGS_H_
