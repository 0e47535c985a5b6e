// CUDA layers; see cuda_layers.h. Straight ports of cpu_layers.cc: one thread per row (or per
// output element) so every sum has a fixed order.
#include "trainer/cuda_layers.h"

namespace gradsnap {
namespace trainer {
namespace cuda {
namespace {

constexpr int kThreads = 256;
inline int Blocks(size_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }
__device__ inline float Ld(const bf16* p, size_t i) { return __bfloat162float(p[i]); }

__global__ void EncoderForwardKernel(float* out, const int32_t* inp, const bf16* wte,
                                     const bf16* wpe, int B, int T, int C) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<size_t>(B) * T * C) return;
  const int c = idx % C, bt = idx / C, t = bt % T;
  out[idx] = Ld(wte, static_cast<size_t>(inp[bt]) * C + c) +
             Ld(wpe, static_cast<size_t>(t) * C + c);
}

// One thread per (v, c): scans every position for token v (deterministic, no atomics).
__global__ void EncoderBackwardWteKernel(float* dwte, const float* dout, const int32_t* inp,
                                         int BT, int C, int V) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<size_t>(V) * C) return;
  const int c = idx % C, v = idx / C;
  float acc = 0.0f;
  for (int i = 0; i < BT; ++i) {
    if (inp[i] == v) acc += dout[static_cast<size_t>(i) * C + c];
  }
  dwte[idx] += acc;
}

__global__ void EncoderBackwardWpeKernel(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<size_t>(T) * C) return;
  float acc = 0.0f;
  for (int b = 0; b < B; ++b) acc += dout[static_cast<size_t>(b) * T * C + idx];
  dwpe[idx] += acc;
}

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const bf16* w, const bf16* b, int N, int C) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* x = inp + static_cast<size_t>(n) * C;
  float m = 0.0f;
  for (int i = 0; i < C; ++i) m += x[i];
  m /= C;
  float var = 0.0f;
  for (int i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
  var /= C;
  const float s = rsqrtf(var + 1e-5f);
  float* o = out + static_cast<size_t>(n) * C;
  for (int i = 0; i < C; ++i) o[i] = (s * (x[i] - m)) * Ld(w, i) + Ld(b, i);
  mean[n] = m;
  rstd[n] = s;
}

__global__ void LayerNormBackwardInputKernel(float* dinp, const float* dout, const float* inp,
                                             const bf16* w, const float* mean,
                                             const float* rstd, int N, int C) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* d = dout + static_cast<size_t>(n) * C;
  const float* x = inp + static_cast<size_t>(n) * C;
  float* dx = dinp + static_cast<size_t>(n) * C;
  const float m = mean[n], s = rstd[n];
  float dmean = 0.0f, dnorm_mean = 0.0f;
  for (int i = 0; i < C; ++i) {
    const float dn = Ld(w, i) * d[i];
    dmean += dn;
    dnorm_mean += dn * (x[i] - m) * s;
  }
  dmean /= C;
  dnorm_mean /= C;
  for (int i = 0; i < C; ++i) {
    const float norm = (x[i] - m) * s;
    dx[i] += (Ld(w, i) * d[i] - dmean - norm * dnorm_mean) * s;
  }
}

__global__ void LayerNormBackwardParamsKernel(float* dweight, float* dbias, const float* dout,
                                              const float* inp, const float* mean,
                                              const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int n = 0; n < N; ++n) {
    const size_t i = static_cast<size_t>(n) * C + c;
    dw += (inp[i] - mean[n]) * rstd[n] * dout[i];
    db += dout[i];
  }
  dweight[c] += dw;
  dbias[c] += db;
}

__global__ void AddBiasKernel(float* out, const bf16* bias, int N, int OC) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx < static_cast<size_t>(N) * OC) out[idx] += Ld(bias, idx % OC);
}

__global__ void BiasBackwardKernel(float* dbias, const float* dout, int N, int OC) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= OC) return;
  float acc = 0.0f;
  for (int n = 0; n < N; ++n) acc += dout[static_cast<size_t>(n) * OC + j];
  dbias[j] += acc;
}

__global__ void AttentionForwardKernel(float* out, float* preatt, float* att, const float* inp,
                                       int B, int T, int C, int NH) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * T * NH) return;
  const int h = idx % NH, t = (idx / NH) % T, b = idx / (NH * T);
  const int C3 = 3 * C, hs = C / NH;
  const float scale = rsqrtf(static_cast<float>(hs));
  const float* q = inp + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
  float* pre = preatt + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
  float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
  float maxval = -1e30f;
  for (int t2 = 0; t2 <= t; ++t2) {
    const float* k = inp + (static_cast<size_t>(b) * T + t2) * C3 + h * hs + C;
    float dot = 0.0f;
    for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
    dot *= scale;
    pre[t2] = dot;
    maxval = fmaxf(maxval, dot);
  }
  float sum = 0.0f;
  for (int t2 = 0; t2 <= t; ++t2) {
    a[t2] = expf(pre[t2] - maxval);
    sum += a[t2];
  }
  const float inv = 1.0f / sum;
  for (int t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
  float* o = out + (static_cast<size_t>(b) * T + t) * C + h * hs;
  for (int i = 0; i < hs; ++i) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) {
      acc += a[t2] * inp[(static_cast<size_t>(b) * T + t2) * C3 + h * hs + 2 * C + i];
    }
    o[i] = acc;
  }
}

// Per query row (b, h, t): d(att) -> d(preatt) via the softmax Jacobian, then dq.
__global__ void AttentionBackwardQueryKernel(float* dinp, float* dpreatt, const float* dout,
                                             const float* inp, const float* att, int B, int T,
                                             int C, int NH) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * T * NH) return;
  const int h = idx % NH, t = (idx / NH) % T, b = idx / (NH * T);
  const int C3 = 3 * C, hs = C / NH;
  const float scale = rsqrtf(static_cast<float>(hs));
  const size_t row = ((static_cast<size_t>(b) * NH + h) * T + t) * T;
  const float* a = att + row;
  float* dpre = dpreatt + row;
  const float* d = dout + (static_cast<size_t>(b) * T + t) * C + h * hs;
  float dot_ada = 0.0f;
  for (int t2 = 0; t2 <= t; ++t2) {
    const float* v = inp + (static_cast<size_t>(b) * T + t2) * C3 + h * hs + 2 * C;
    float da = 0.0f;
    for (int i = 0; i < hs; ++i) da += v[i] * d[i];
    dpre[t2] = da;  // d(att) for now
    dot_ada += a[t2] * da;
  }
  for (int t2 = 0; t2 < T; ++t2) dpre[t2] = t2 <= t ? a[t2] * (dpre[t2] - dot_ada) : 0.0f;
  float* dq = dinp + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
  for (int i = 0; i < hs; ++i) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) {
      acc += dpre[t2] * inp[(static_cast<size_t>(b) * T + t2) * C3 + h * hs + C + i];
    }
    dq[i] = acc * scale;
  }
}

// Per key/value row (b, h, t2): dk and dv sum over the queries t >= t2 that attend to it.
__global__ void AttentionBackwardKeyValueKernel(float* dinp, const float* dpreatt,
                                                const float* dout, const float* inp,
                                                const float* att, int B, int T, int C, int NH) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * T * NH) return;
  const int h = idx % NH, t2 = (idx / NH) % T, b = idx / (NH * T);
  const int C3 = 3 * C, hs = C / NH;
  const float scale = rsqrtf(static_cast<float>(hs));
  float* dk = dinp + (static_cast<size_t>(b) * T + t2) * C3 + h * hs + C;
  float* dv = dk + C;
  for (int i = 0; i < hs; ++i) {
    float acck = 0.0f, accv = 0.0f;
    for (int t = t2; t < T; ++t) {
      const size_t cell = ((static_cast<size_t>(b) * NH + h) * T + t) * T + t2;
      acck += dpreatt[cell] * inp[(static_cast<size_t>(b) * T + t) * C3 + h * hs + i];
      accv += att[cell] * dout[(static_cast<size_t>(b) * T + t) * C + h * hs + i];
    }
    dk[i] = acck * scale;
    dv[i] = accv;
  }
}

constexpr float kGeluScale = 0.7978845608028654f;

__global__ void GeluForwardKernel(float* out, const float* inp, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float x = inp[i];
  const float arg = kGeluScale * (x + 0.044715f * x * x * x);
  const float th = tanhf(arg), ch = coshf(arg);
  const float grad = 0.5f * (1.0f + th) +
                     x * 0.5f * (1.0f / (ch * ch)) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] += grad * dout[i];
}

__global__ void ResidualForwardKernel(float* out, const float* a, const float* b, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) out[i] = a[i] + b[i];
}

__global__ void ResidualBackwardKernel(float* da, float* db, const float* dout, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  da[i] += dout[i];
  db[i] += dout[i];
}

__global__ void SoftmaxCrossEntropyKernel(float* probs, float* losses, const float* logits,
                                          const int32_t* targets, int BT, int V) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= BT) return;
  const float* l = logits + static_cast<size_t>(n) * V;
  float* p = probs + static_cast<size_t>(n) * V;
  float maxval = -1e30f;
  for (int i = 0; i < V; ++i) maxval = fmaxf(maxval, l[i]);
  float sum = 0.0f;
  for (int i = 0; i < V; ++i) {
    p[i] = expf(l[i] - maxval);
    sum += p[i];
  }
  for (int i = 0; i < V; ++i) p[i] /= sum;
  losses[n] = -logf(p[targets[n]]);
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* probs,
                                           const int32_t* targets, float dloss, int BT, int V) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<size_t>(BT) * V) return;
  const int n = idx / V, i = idx % V;
  dlogits[idx] += (probs[idx] - (i == targets[n] ? 1.0f : 0.0f)) * dloss;
}

__global__ void FloatToBf16Kernel(bf16* out, const float* in, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void SquaredNormKernel(double* partials, const bf16* in, size_t n) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double x = __bfloat162float(in[i]);
    acc += x * x;
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ void AdamWKernel(float* master, float* m, float* v, const uint16_t* grad,
                            uint16_t* params_bf16, size_t n, AdamWStepParams p) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  AdamWElement(master + i, m + i, v + i, Bf16ToFloat(grad[i]), p);
  params_bf16[i] = ::gradsnap::FloatToBf16(master[i]);
}

}  // namespace

void EncoderForward(cudaStream_t s, float* out, const int32_t* inp, const bf16* wte,
                    const bf16* wpe, int B, int T, int C) {
  const size_t n = static_cast<size_t>(B) * T * C;
  EncoderForwardKernel<<<Blocks(n), kThreads, 0, s>>>(out, inp, wte, wpe, B, T, C);
}

void EncoderBackward(cudaStream_t s, float* dwte, float* dwpe, const float* dout,
                     const int32_t* inp, int B, int T, int C, int V) {
  EncoderBackwardWteKernel<<<Blocks(static_cast<size_t>(V) * C), kThreads, 0, s>>>(
      dwte, dout, inp, B * T, C, V);
  EncoderBackwardWpeKernel<<<Blocks(static_cast<size_t>(T) * C), kThreads, 0, s>>>(dwpe, dout, B,
                                                                                   T, C);
}

void LayerNormForward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp,
                      const bf16* weight, const bf16* bias, int N, int C) {
  LayerNormForwardKernel<<<Blocks(N), kThreads, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C);
}

void LayerNormBackward(cudaStream_t s, float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const bf16* weight,
                       const float* mean, const float* rstd, int N, int C) {
  LayerNormBackwardInputKernel<<<Blocks(N), kThreads, 0, s>>>(dinp, dout, inp, weight, mean, rstd,
                                                              N, C);
  LayerNormBackwardParamsKernel<<<Blocks(C), kThreads, 0, s>>>(dweight, dbias, dout, inp, mean,
                                                               rstd, N, C);
}

cublasStatus_t MatmulForward(cublasHandle_t h, cudaStream_t s, float* out, const float* inp,
                             const bf16* weight, const bf16* bias, int N, int C, int OC,
                             bf16* scratch) {
  const float one = 1.0f, zero = 0.0f;
  FloatToBf16(s, scratch, inp, static_cast<size_t>(N) * C);
  // Column-major view: out^T (OC, N) = weight^T^T (OC, C) x inp^T (C, N).
  const cublasStatus_t st =
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, CUDA_R_16BF, C, scratch,
                   CUDA_R_16BF, C, &zero, out, CUDA_R_32F, OC, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  if (bias != nullptr) {
    AddBiasKernel<<<Blocks(static_cast<size_t>(N) * OC), kThreads, 0, s>>>(out, bias, N, OC);
  }
  return st;
}

cublasStatus_t MatmulBackward(cublasHandle_t h, cudaStream_t s, float* dinp, float* dweight,
                              float* dbias, const float* dout, const float* inp,
                              const bf16* weight, int N, int C, int OC, bf16* scratch_a,
                              bf16* scratch_b) {
  const float one = 1.0f;
  FloatToBf16(s, scratch_a, dout, static_cast<size_t>(N) * OC);
  FloatToBf16(s, scratch_b, inp, static_cast<size_t>(N) * C);
  // dinp (N, C) += dout (N, OC) @ weight (OC, C)
  cublasStatus_t st =
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, CUDA_R_16BF, C, scratch_a,
                   CUDA_R_16BF, OC, &one, dinp, CUDA_R_32F, C, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
  st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, scratch_b, CUDA_R_16BF, C,
                    scratch_a, CUDA_R_16BF, OC, &one, dweight, CUDA_R_32F, C,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (dbias != nullptr) BiasBackwardKernel<<<Blocks(OC), kThreads, 0, s>>>(dbias, dout, N, OC);
  return st;
}

void AttentionForward(cudaStream_t s, float* out, float* preatt, float* att, const float* inp,
                      int B, int T, int C, int NH) {
  AttentionForwardKernel<<<Blocks(B * T * NH), kThreads, 0, s>>>(out, preatt, att, inp, B, T, C,
                                                                 NH);
}

void AttentionBackward(cudaStream_t s, float* dinp, float* dpreatt, const float* dout,
                       const float* inp, const float* att, int B, int T, int C, int NH) {
  AttentionBackwardQueryKernel<<<Blocks(B * T * NH), kThreads, 0, s>>>(dinp, dpreatt, dout, inp,
                                                                       att, B, T, C, NH);
  AttentionBackwardKeyValueKernel<<<Blocks(B * T * NH), kThreads, 0, s>>>(dinp, dpreatt, dout,
                                                                          inp, att, B, T, C, NH);
}

void GeluForward(cudaStream_t s, float* out, const float* inp, int N) {
  GeluForwardKernel<<<Blocks(N), kThreads, 0, s>>>(out, inp, N);
}
void GeluBackward(cudaStream_t s, float* dinp, const float* inp, const float* dout, int N) {
  GeluBackwardKernel<<<Blocks(N), kThreads, 0, s>>>(dinp, inp, dout, N);
}
void ResidualForward(cudaStream_t s, float* out, const float* a, const float* b, int N) {
  ResidualForwardKernel<<<Blocks(N), kThreads, 0, s>>>(out, a, b, N);
}
void ResidualBackward(cudaStream_t s, float* da, float* db, const float* dout, int N) {
  ResidualBackwardKernel<<<Blocks(N), kThreads, 0, s>>>(da, db, dout, N);
}
void SoftmaxCrossEntropyForward(cudaStream_t s, float* probs, float* losses, const float* logits,
                                const int32_t* targets, int BT, int V) {
  SoftmaxCrossEntropyKernel<<<Blocks(BT), kThreads, 0, s>>>(probs, losses, logits, targets, BT, V);
}
void CrossEntropySoftmaxBackward(cudaStream_t s, float* dlogits, const float* probs,
                                 const int32_t* targets, float dloss, int BT, int V) {
  CrossEntropyBackwardKernel<<<Blocks(static_cast<size_t>(BT) * V), kThreads, 0, s>>>(
      dlogits, probs, targets, dloss, BT, V);
}
void FloatToBf16(cudaStream_t s, bf16* out, const float* in, size_t n) {
  FloatToBf16Kernel<<<Blocks(n), kThreads, 0, s>>>(out, in, n);
}
void SquaredNormPartials(cudaStream_t s, double* partials, const bf16* in, size_t n) {
  SquaredNormKernel<<<kNormBlocks, kThreads, 0, s>>>(partials, in, n);
}
void AdamWUpdate(cudaStream_t s, float* master, float* m, float* v, const uint16_t* grad,
                 uint16_t* params_bf16, size_t n, const AdamWStepParams& p) {
  if (n == 0) return;
  AdamWKernel<<<Blocks(n), kThreads, 0, s>>>(master, m, v, grad, params_bf16, n, p);
}

}  // namespace cuda
}  // namespace trainer
}  // namespace gradsnap
