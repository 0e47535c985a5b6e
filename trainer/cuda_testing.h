// Test hooks into the CUDA back end (cuda_backend.cu; stubs without CUDA).
#ifndef GRADSNAP_TRAINER_CUDA_TESTING_H_
#define GRADSNAP_TRAINER_CUDA_TESTING_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "gpu_snapshot/adamw.h"

namespace gradsnap {
namespace trainer {

// Runs the device AdamW kernel of the trainer on host arrays (copied in and out), bf16
// gradients. FAILED_PRECONDITION without a GPU, UNIMPLEMENTED in builds without CUDA.
absl::Status DeviceAdamWForTest(float* param, float* m, float* v, const uint16_t* grad, size_t n,
                                const AdamWStepParams& p);

// The back end's NCCL deadline on one GPU (two ranks cannot share a GPU in NCCL): a one-rank
// NCCL communicator does an all-reduce on a new stream, then a host function that blocks until
// released (`block`) or returns at once; the back end's waiter polls an event after it with
// `timeout`, and its expiry aborts the communicator (ncclCommAbort; *aborted set). Returns the
// wait's status: UNAVAILABLE "collective deadline: ..." on expiry. The host function is released
// and the stream drained before it returns. FAILED_PRECONDITION without a GPU, UNIMPLEMENTED in
// builds without CUDA or NCCL.
absl::Status NcclDeadlineForTest(std::chrono::milliseconds timeout, bool block, bool* aborted);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CUDA_TESTING_H_
