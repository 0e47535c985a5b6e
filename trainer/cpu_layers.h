// The layers of the GPT model on the CPU, fp32, after llm.c's train_gpt2.c. Every layer is a
// *_forward / *_backward pair with the argument order (outputs, inputs, parameters, sizes,
// pool); backward functions ACCUMULATE (+=) into their gradient outputs unless said otherwise.
// Matrix products go through OpenBLAS (cblas_sgemm; OpenBLAS threads the large ones itself).
// Everything else runs on `pool` (null: the caller's thread alone), and so do attention's
// per-head products, with OpenBLAS set to one thread meanwhile (openblas_set_num_threads, the
// count restored after: no other OpenBLAS call may run concurrently).
//
// DETERMINISM (docs/trainer.md, "Numerics"): the results do not depend on the pool's thread
// count. Work is split so that every output element is computed by one thread, with the same
// operations in the same order as on one thread: element-wise and per-row layers split the
// rows; reductions over rows (bias, LayerNorm and embedding gradients) split the columns and
// sum the rows of each column in row order. OpenBLAS splits its products by output blocks, each
// summed over the whole inner dimension in one order, whatever its thread count.
//
// Shapes: B batch, T time, C channels, OC output channels, NH heads, V vocabulary.
// Thread safety: pure functions over caller buffers; one call at a time per pool.
#ifndef GRADSNAP_TRAINER_CPU_LAYERS_H_
#define GRADSNAP_TRAINER_CPU_LAYERS_H_

#include <cstdint>

#include "common/thread_pool.h"

namespace gradsnap {
namespace trainer {

// out (B,T,C) = wte[inp] + wpe[t]
void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, ThreadPool* pool = nullptr);
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                     int T, int C, ThreadPool* pool = nullptr);

// out (N,C) = LayerNorm(inp) * weight + bias; mean, rstd (N) are saved for backward.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, ThreadPool* pool = nullptr);
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean,
                       const float* rstd, int N, int C, ThreadPool* pool = nullptr);

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null.
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC, ThreadPool* pool = nullptr);
// MatmulForward then GeluForward, the bias and the GELU in one pass over the product:
// pre (N,OC) = inp @ weight^T + bias, out (N,OC) = GELU(pre).
void MatmulGeluForward(float* pre, float* out, const float* inp, const float* weight,
                       const float* bias, int N, int C, int OC, ThreadPool* pool = nullptr);
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int N, int C, int OC,
                    ThreadPool* pool = nullptr);

// Causal multi-head self-attention. inp (B,T,3C) holds q,k,v; out (B,T,C);
// preatt, att (B,NH,T,T) are saved for backward (zero above the diagonal).
void AttentionForward(float* out, float* preatt, float* att, const float* inp, int B, int T,
                      int C, int NH, ThreadPool* pool = nullptr);
// dinp (B,T,3C) accumulates; dpreatt and datt (B,NH,T,T) are scratch, OVERWRITTEN. Linear in
// the softmax row length: d(preatt)[t3] = att[t3] * (datt[t3] - sum_t2 att[t2] * datt[t2]).
void AttentionBackward(float* dinp, float* dpreatt, float* datt, const float* dout,
                       const float* inp, const float* att, int B, int T, int C, int NH,
                       ThreadPool* pool = nullptr);

// GELU, tanh approximation (tanh as a rational function, exact to a few ulp).
void GeluForward(float* out, const float* inp, int N, ThreadPool* pool = nullptr);
void GeluBackward(float* dinp, const float* inp, const float* dout, int N,
                  ThreadPool* pool = nullptr);

// out = inp1 + inp2 (N); backward adds dout to both.
void ResidualForward(float* out, const float* inp1, const float* inp2, int N,
                     ThreadPool* pool = nullptr);
void ResidualBackward(float* dinp1, float* dinp2, const float* dout, int N,
                      ThreadPool* pool = nullptr);

// probs (B,T,V) = softmax(logits); losses (B,T) = -log probs[target].
void SoftmaxForward(float* probs, const float* logits, int BT, int V, ThreadPool* pool = nullptr);
void CrossEntropyForward(float* losses, const float* probs, const int32_t* targets, int BT, int V,
                         ThreadPool* pool = nullptr);
// dlogits (B,T,V) += (probs - onehot(target)) * dloss, where every token's dloss is `dloss`.
void CrossEntropySoftmaxBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int BT, int V, ThreadPool* pool = nullptr);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CPU_LAYERS_H_
