// The GPT-2-style decoder on the CPU (fp32): token + position embeddings, pre-LayerNorm blocks
// with causal multi-head attention and a GELU MLP, final LayerNorm, output head tied to wte.
// Parameters and gradients live in flat buffers laid out by ParamLayout; this class owns only
// the activations of one micro-batch (B sequences of T tokens).
//
// Thread safety: one thread at a time per object (OpenBLAS and the pool use their own threads
// inside; the results do not depend on their thread counts, cpu_layers.h).
#ifndef GRADSNAP_TRAINER_CPU_GPT_H_
#define GRADSNAP_TRAINER_CPU_GPT_H_

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "trainer/layer_activations.h"
#include "trainer/model_config.h"

namespace gradsnap {
namespace trainer {

class CpuGpt {
 public:
  // B sequences of T <= max_seq_len tokens per call. The layers run on `pool` (not owned; null:
  // on the caller's thread).
  CpuGpt(const ModelConfig& config, int B, int T, ThreadPool* pool = nullptr);
  // acts_ points into the buffers: a copy would share them.
  CpuGpt(const CpuGpt&) = delete;
  CpuGpt& operator=(const CpuGpt&) = delete;

  // Forward pass; returns the SUM of the B*T token losses (cross-entropy, nats).
  double Forward(const float* params, const int32_t* inputs, const int32_t* targets);
  // Forward, then backward with every token's loss weighted by `dloss` (1 / tokens of the whole
  // global batch, so the gradients of all ranks sum to the gradient of the mean loss).
  // ACCUMULATES into grads (flat, ParamLayout::total() elements). Returns the loss sum.
  double ForwardBackward(const float* params, float* grads, const int32_t* inputs,
                         const int32_t* targets, float dloss);

  const ParamLayout& layout() const { return layout_; }

 private:
  void Backward(const float* params, float* grads, const int32_t* inputs, const int32_t* targets,
                float dloss);

  // Zeroes v on the pool.
  void Zero(std::vector<float>& v);

  ModelConfig config_;
  ParamLayout layout_;
  int B_, T_;
  ThreadPool* pool_;
  // Saved activations (llm.c's ActivationTensors), per layer where stacked over L.
  std::vector<float> encoded_;                  // (B,T,C)
  std::vector<float> ln1_, ln1_mean_, ln1_rstd_;  // (L,B,T,C), (L,B,T)
  std::vector<float> qkv_;                      // (L,B,T,3C)
  std::vector<float> atty_;                     // (L,B,T,C)
  std::vector<float> preatt_, att_;             // (L,B,NH,T,T)
  std::vector<float> attproj_, residual2_;      // (L,B,T,C)
  std::vector<float> ln2_, ln2_mean_, ln2_rstd_;
  std::vector<float> fch_, fch_gelu_;           // (L,B,T,4C)
  std::vector<float> fcproj_, residual3_;       // (L,B,T,C)
  LayerActivations acts_;  // layer 0's slices of the buffers above (Layer(l): layer l's)
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_;  // (B,T,C), (B,T)
  std::vector<float> logits_, probs_;           // (B,T,V)
  std::vector<float> losses_;                   // (B,T)
  // Gradient scratch for one layer, reused over layers.
  std::vector<float> dres_, dres_prev_, dres2_, dln_, dqkv_, datty_, dpreatt_, datt_;
  std::vector<float> dattproj_, dfch_, dfch_gelu_, dfcproj_, dlogits_;
};

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_CPU_GPT_H_
