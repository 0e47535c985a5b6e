// The simulated-device back end of the trainer (`--device sim`, docs/trainer.md): the CPU back
// end's kernels (fp32, bit-identical results) run asynchronously on a compute stream of a
// simulated GPU (gpu_snapshot/sim_device.h), with the rank's state in that device's memory and a
// separate reduced-gradient slice written by ReduceGrads, as on CUDA. So the snapshot engine
// meets a GPU's schedule: launches that return at once, events, copies racing kernels.
//
// Thread safety: one thread at a time (the training thread); kernels run on the stream's thread.
#ifndef GRADSNAP_TRAINER_SIM_BACKEND_H_
#define GRADSNAP_TRAINER_SIM_BACKEND_H_

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "gpu_snapshot/sim_device.h"
#include "trainer/backend.h"

namespace gradsnap {
namespace trainer {

// Opens simulated device `device_ordinal` with `sim` (first use in the process) and makes it the
// training thread's current device. INVALID_ARGUMENT for a bad ordinal or bandwidth. `comm` is
// the device's collective group, used by kernels only (NCCL's part: the trainer gives it no
// limit of its own); every host wait for the stream polls its event with `collective_timeout`
// (several ranks; --collective-timeout-s) and aborts `comm` when it passes, failing with
// UNAVAILABLE "collective deadline: ..." (common/deadline_wait.h).
absl::StatusOr<std::unique_ptr<Backend>> NewSimBackend(
    const ModelConfig& config, int local_batch, int seq_len, Comm* comm, int device_ordinal,
    const gpu_snapshot::SimOptions& sim, std::chrono::milliseconds collective_timeout);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_SIM_BACKEND_H_
