// Builds a trivial kernel for the configured architecture and runs it when a GPU is present.
// Exit 0 on success or when no device exists (the CPU-only CI machine); non-zero otherwise.
#include <cstdio>

#include <cuda_runtime.h>

__global__ void AddOne(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], 1.0f);
}

int main() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("cuda_smoke: no CUDA device (%s); compile-only check passed\n",
                err == cudaSuccess ? "count=0" : cudaGetErrorString(err));
    return 0;
  }
  const int n = 1024;
  float* d = nullptr;
  if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) return 1;
  cudaMemset(d, 0, n * sizeof(float));
  AddOne<<<(n + 255) / 256, 256>>>(d, n);
  float h[n];
  if (cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
  cudaFree(d);
  for (int i = 0; i < n; ++i)
    if (h[i] != 1.0f) return 1;
  std::printf("cuda_smoke: kernel ran on %d device(s)\n", count);
  return 0;
}
