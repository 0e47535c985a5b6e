#include "gpu_snapshot/cuda_test_kernels.h"

#include <cuda_runtime.h>

namespace gradsnap {
namespace gpu_snapshot {
namespace {

__global__ void AdamWF32(float* p, float* m, float* v, const float* g, size_t n,
                         AdamWStepParams h) {
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) AdamWElement(p + i, m + i, v + i, g[i], h);
}

__global__ void AdamWBf16(float* p, float* m, float* v, const uint16_t* g, size_t n,
                          AdamWStepParams h) {
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) AdamWElement(p + i, m + i, v + i, Bf16ToFloat(g[i]), h);
}

}  // namespace

bool DeviceAdamW(float* p, float* m, float* v, const void* grad, bool bf16, size_t n,
                 const AdamWStepParams& h) {
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  if (bf16) {
    AdamWBf16<<<blocks, threads>>>(p, m, v, static_cast<const uint16_t*>(grad), n, h);
  } else {
    AdamWF32<<<blocks, threads>>>(p, m, v, static_cast<const float*>(grad), n, h);
  }
  return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
