// Test-only: the device AdamW of gpu_snapshot/adamw.h as a CUDA kernel, so the GPU test can
// check device arithmetic against the host replay bit for bit. Plain C++ interface (no CUDA
// types), implemented in cuda_test_kernels.cu.
#ifndef GRADSNAP_GPU_SNAPSHOT_CUDA_TEST_KERNELS_H_
#define GRADSNAP_GPU_SNAPSHOT_CUDA_TEST_KERNELS_H_

#include <cstddef>

#include "gpu_snapshot/adamw.h"

namespace gradsnap {
namespace gpu_snapshot {

// Applies one AdamW update to n elements in device memory on the legacy default stream and
// waits for it. `grad` is fp32 or (bf16 = true) bf16. Returns false on a CUDA error.
bool DeviceAdamW(float* p, float* m, float* v, const void* grad, bool bf16, size_t n,
                 const AdamWStepParams& h);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_CUDA_TEST_KERNELS_H_
