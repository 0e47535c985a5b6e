// Test hooks into the CUDA back end (cuda_backend.cu; stubs without CUDA).
#ifndef GRADSNAP_TRAINER_CUDA_TESTING_H_
#define GRADSNAP_TRAINER_CUDA_TESTING_H_

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

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CUDA_TESTING_H_
