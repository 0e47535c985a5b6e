// The simulated-device back end of the trainer (`--device sim`, docs/trainer.md): the CPU back
// end's kernels run asynchronously on a compute stream of a simulated GPU
// (gpu_snapshot/sim_device.h), with the rank's state in that device's memory in the CUDA back
// end's precision layout: fp32 master weights and AdamW moments, a bf16 compute copy of the
// parameters that forward and backward read (the CPU kernels compute in fp32 from its values),
// and a separate bf16 reduced-gradient slice written by ReduceGrads that the norm, the
// optimizer and the snapshot engine read. So the snapshot engine meets a GPU's schedule
// (launches that return at once, events, copies racing kernels) and a GPU's copy sizes. The
// results are bit-identical run to run, differ from the CPU back end's (fp32 throughout), and
// with 2 ranks differ from 1 rank's (the fp32 reduction's order, as on the CPU).
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
