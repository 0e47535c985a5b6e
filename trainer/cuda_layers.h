// CUDA layers of the GPT model: the same *_forward / *_backward pairs as cpu_layers.h, as kernel
// launchers on a stream. Mixed precision: activations and weight gradients are fp32, the
// parameters the layers read are the bf16 compute copy, and matrix products run in bf16 with
// fp32 accumulation (cuBLAS). Every reduction has a fixed order (no atomics), so a run is
// deterministic on a given GPU. Only included by .cu files.
//
// Thread safety: launchers enqueue work on the given stream; one host thread per stream.
#ifndef GRADSNAP_TRAINER_CUDA_LAYERS_H_
#define GRADSNAP_TRAINER_CUDA_LAYERS_H_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_snapshot/adamw.h"

namespace gradsnap {
namespace trainer {
namespace cuda {

using bf16 = __nv_bfloat16;

void EncoderForward(cudaStream_t s, float* out, const int32_t* inp, const bf16* wte,
                    const bf16* wpe, int B, int T, int C);
void EncoderBackward(cudaStream_t s, float* dwte, float* dwpe, const float* dout,
                     const int32_t* inp, int B, int T, int C, int V);
void LayerNormForward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp,
                      const bf16* weight, const bf16* bias, int N, int C);
void LayerNormBackward(cudaStream_t s, float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const bf16* weight,
                       const float* mean, const float* rstd, int N, int C);
// scratch: >= N * max(C, OC) bf16 elements (the bf16 copy of the fp32 input). Both matmuls
// return the first cuBLAS error (CUBLAS_STATUS_SUCCESS when none).
cublasStatus_t MatmulForward(cublasHandle_t h, cudaStream_t s, float* out, const float* inp,
                             const bf16* weight, const bf16* bias, int N, int C, int OC,
                             bf16* scratch);
// scratch_a, scratch_b: >= N * max(C, OC) bf16 elements each.
cublasStatus_t MatmulBackward(cublasHandle_t h, cudaStream_t s, float* dinp, float* dweight, float* dbias,
                    const float* dout, const float* inp, const bf16* weight, int N, int C,
                    int OC, bf16* scratch_a, bf16* scratch_b);
void AttentionForward(cudaStream_t s, float* out, float* preatt, float* att, const float* inp,
                      int B, int T, int C, int NH);
// dinp is overwritten (not accumulated); dpreatt is scratch (B,NH,T,T).
void AttentionBackward(cudaStream_t s, float* dinp, float* dpreatt, const float* dout,
                       const float* inp, const float* att, int B, int T, int C, int NH);
void GeluForward(cudaStream_t s, float* out, const float* inp, int N);
void GeluBackward(cudaStream_t s, float* dinp, const float* inp, const float* dout, int N);
void ResidualForward(cudaStream_t s, float* out, const float* a, const float* b, int N);
// da += dout; db += dout
void ResidualBackward(cudaStream_t s, float* da, float* db, const float* dout, int N);
void SoftmaxCrossEntropyForward(cudaStream_t s, float* probs, float* losses, const float* logits,
                                const int32_t* targets, int BT, int V);
void CrossEntropySoftmaxBackward(cudaStream_t s, float* dlogits, const float* probs,
                                 const int32_t* targets, float dloss, int BT, int V);
void FloatToBf16(cudaStream_t s, bf16* out, const float* in, size_t n);
// partials[0, kNormBlocks) <- partial sums of in[i]^2 in double, fixed order.
inline constexpr int kNormBlocks = 128;
void SquaredNormPartials(cudaStream_t s, double* partials, const bf16* in, size_t n);
// AdamW over a slice with bf16 gradients (gpu_snapshot/adamw.h), then the bf16 compute copy.
void AdamWUpdate(cudaStream_t s, float* master, float* m, float* v, const uint16_t* grad,
                 uint16_t* params_bf16, size_t n, const AdamWStepParams& p);

}  // namespace cuda
}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CUDA_LAYERS_H_
