#include "gpu_snapshot/device_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_snapshot/device.h"

ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda or sim (the simulated asynchronous GPU, docs/trainer.md). Default: cpu");
ABSL_FLAG(int, device_id, 0,
          "cuda/sim: the first device of this node's ranks; the rank with local index L uses "
          "device device_id + L. Default: 0");
ABSL_FLAG(double, sim_copy_gbps, 0.4,
          "sim: device-to-host copy bandwidth of the simulated copy engine, GB/s (> 0): the "
          "state takes about 1.7 unloaded steps of snapshot_bench's small model, a typical LLM "
          "step on an H200; 0.1 is GoCkpt's setting of about 7 steps (docs/gockpt.md). "
          "Default: 0.4");

namespace gradsnap {
namespace gpu_snapshot {

absl::StatusOr<DeviceKind> DeviceFlag() { return ParseDeviceKind(absl::GetFlag(FLAGS_device)); }

absl::Status CheckDeviceFlags(int ranks) {
  ASSIGN_OR_RETURN(const DeviceKind device, DeviceFlag());
  if (device == DeviceKind::kSim && !(absl::GetFlag(FLAGS_sim_copy_gbps) > 0)) {
    return absl::InvalidArgumentError("--sim_copy_gbps must be > 0");
  }
  return CheckDevices(device, absl::GetFlag(FLAGS_device_id), ranks);
}

std::vector<std::string> DeviceFlagArgs() {
  const absl::StatusOr<DeviceKind> device = DeviceFlag();
  std::vector<std::string> args = {absl::StrCat("--device=", absl::GetFlag(FLAGS_device)),
                                   absl::StrCat("--device_id=", absl::GetFlag(FLAGS_device_id))};
  if (device.ok() && *device == DeviceKind::kSim) {
    args.push_back(absl::StrCat("--sim_copy_gbps=", absl::GetFlag(FLAGS_sim_copy_gbps)));
  }
  return args;
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
