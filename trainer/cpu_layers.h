// The layers of the GPT model on the CPU, fp32: the reference implementation (llm.c's
// train_gpt2.c). Every layer is a *_forward / *_backward pair with the argument order
// (outputs, inputs, parameters, sizes); backward functions ACCUMULATE (+=) into their
// gradient outputs. Matrix products go through OpenBLAS (cblas_sgemm).
//
// Shapes: B batch, T time, C channels, OC output channels, NH heads, V vocabulary.
// Thread safety: pure functions over caller buffers.
#ifndef GRADSNAP_TRAINER_CPU_LAYERS_H_
#define GRADSNAP_TRAINER_CPU_LAYERS_H_

#include <cstdint>

namespace gradsnap {
namespace trainer {

// out (B,T,C) = wte[inp] + wpe[t]
void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C);
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                     int T, int C);

// out (N,C) = LayerNorm(inp) * weight + bias; mean, rstd (N) are saved for backward.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C);
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean,
                       const float* rstd, int N, int C);

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null.
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC);
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int N, int C, int OC);

// Causal multi-head self-attention. inp (B,T,3C) holds q,k,v; out (B,T,C);
// preatt, att (B,NH,T,T) are saved for backward.
void AttentionForward(float* out, float* preatt, float* att, const float* inp, int B, int T,
                      int C, int NH);
void AttentionBackward(float* dinp, float* dpreatt, float* datt, const float* dout,
                       const float* inp, const float* att, int B, int T, int C, int NH);

// GELU, tanh approximation.
void GeluForward(float* out, const float* inp, int N);
void GeluBackward(float* dinp, const float* inp, const float* dout, int N);

// out = inp1 + inp2 (N); backward adds dout to both.
void ResidualForward(float* out, const float* inp1, const float* inp2, int N);
void ResidualBackward(float* dinp1, float* dinp2, const float* dout, int N);

// probs (B,T,V) = softmax(logits); losses (B,T) = -log probs[target].
void SoftmaxForward(float* probs, const float* logits, int BT, int V);
void CrossEntropyForward(float* losses, const float* probs, const int32_t* targets, int BT, int V);
// dlogits (B,T,V) += (probs - onehot(target)) * dloss, where every token's dloss is `dloss`.
void CrossEntropySoftmaxBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int BT, int V);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CPU_LAYERS_H_
