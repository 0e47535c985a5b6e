// The AdamW update, written once for the device optimizer (trainer/) and the host replay
// (gpu_snapshot/). DESIGN.md section 4: the reconstructed checkpoint must be byte-identical to
// a stop-the-world snapshot, so both sides run *this* function, element by element, with the
// same operation order. Every operation is an explicit IEEE round-to-nearest primitive on CUDA
// (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn: never fused, never approximated) and plain
// operators on the host, where the build passes -ffp-contract=off and no -ffast-math.
//
// Everything that varies per update (learning rate, clip coefficient, bias corrections, whether
// the step was skipped) comes in AdamWStepParams, computed once per update on the host by
// MakeAdamWStepParams and logged with the gradient, so the replay never recomputes it.
#ifndef GRADSNAP_GPU_SNAPSHOT_ADAMW_H_
#define GRADSNAP_GPU_SNAPSHOT_ADAMW_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GS_HD __host__ __device__ __forceinline__
#else
#define GS_HD inline
#endif

namespace gradsnap {

// Hyperparameters fixed for a run. Default values are GPT-2-like.
struct AdamWConfig {
  float beta1 = 0.9f;         // Default: 0.9
  float beta2 = 0.95f;        // Default: 0.95
  float eps = 1e-8f;          // Default: 1e-8
  float weight_decay = 0.1f;  // Default: 0.1 (decoupled)
};

// What one update u consumed, besides the gradient: the run's hyperparameters plus this update's
// scalars. 32 bytes, logged in every DELTA record (field by field, in declaration order: see
// EncodeDeltaHeader and docs/gockpt.md).
struct AdamWStepParams {
  float lr = 0.0f;          // learning rate of this update (after warmup/cosine schedule)
  float grad_scale = 1.0f;  // multiplier applied to the raw gradient (global-norm clip coef)
  AdamWConfig config;       // the run's betas, eps and weight decay, as of this update
  float bias_correction1 = 1.0f;  // 1 - beta1^t, t = 1-based optimizer step
  float bias_correction2 = 1.0f;  // 1 - beta2^t
};

// Builds the per-update scalars on the host. `t` is the 1-based count of non-skipped updates.
inline AdamWStepParams MakeAdamWStepParams(const AdamWConfig& c, float lr, float grad_scale,
                                           int64_t t) {
  AdamWStepParams p;
  p.lr = lr;
  p.grad_scale = grad_scale;
  p.config = c;
  // Double pow, then one rounding to float: deterministic on every host.
  p.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), t));
  p.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), t));
  return p;
}

#if defined(__CUDA_ARCH__)
#define GS_FMUL(a, b) __fmul_rn((a), (b))
#define GS_FADD(a, b) __fadd_rn((a), (b))
#define GS_FSUB(a, b) __fsub_rn((a), (b))
#define GS_FDIV(a, b) __fdiv_rn((a), (b))
#define GS_FSQRT(a) __fsqrt_rn((a))
#else
#define GS_FMUL(a, b) ((a) * (b))
#define GS_FADD(a, b) ((a) + (b))
#define GS_FSUB(a, b) ((a) - (b))
#define GS_FDIV(a, b) ((a) / (b))
#define GS_FSQRT(a) std::sqrt((a))
#endif

// One element of AdamW with decoupled weight decay:
//   g  = grad * grad_scale
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - lr * ( (m / bc1) / (sqrt(v / bc2) + eps) + wd * p )
GS_HD void AdamWElement(float* param, float* m, float* v, float grad, const AdamWStepParams& h) {
  const AdamWConfig& c = h.config;
  float g = GS_FMUL(grad, h.grad_scale);
  float mn = GS_FADD(GS_FMUL(c.beta1, *m), GS_FMUL(GS_FSUB(1.0f, c.beta1), g));
  float vn = GS_FADD(GS_FMUL(c.beta2, *v), GS_FMUL(GS_FSUB(1.0f, c.beta2), GS_FMUL(g, g)));
  float mhat = GS_FDIV(mn, h.bias_correction1);
  float vhat = GS_FDIV(vn, h.bias_correction2);
  float denom = GS_FADD(GS_FSQRT(vhat), c.eps);
  float upd = GS_FADD(GS_FDIV(mhat, denom), GS_FMUL(c.weight_decay, *param));
  *param = GS_FSUB(*param, GS_FMUL(h.lr, upd));
  *m = mn;
  *v = vn;
}

// bf16 is stored as the top 16 bits of an fp32; widening is exact.
GS_HD float Bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// Round-to-nearest-even fp32 -> bf16 (NaN stays NaN).
GS_HD uint16_t FloatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Host loops over a contiguous slice. `grad` is fp32 or bf16 (mixed precision).
inline void AdamWUpdateHost(float* param, float* m, float* v, const float* grad, size_t n,
                            const AdamWStepParams& h) {
  for (size_t i = 0; i < n; ++i) AdamWElement(param + i, m + i, v + i, grad[i], h);
}
inline void AdamWUpdateHostBf16(float* param, float* m, float* v, const uint16_t* grad, size_t n,
                                const AdamWStepParams& h) {
  for (size_t i = 0; i < n; ++i) AdamWElement(param + i, m + i, v + i, Bf16ToFloat(grad[i]), h);
}

}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_ADAMW_H_
