// GPT forward/backward on the CPU; the layer sequence of llm.c's gpt2_forward/gpt2_backward.
#include "trainer/cpu_gpt.h"

#include <algorithm>

#include "trainer/cpu_layers.h"
#include "trainer/layer_activations.h"

namespace gradsnap {
namespace trainer {
void CpuGpt::Zero(std::vector<float>& v) {
  ParallelFor(pool_, v.size(), [&v](size_t lo, size_t hi) {
    std::fill(v.begin() + lo, v.begin() + hi, 0.0f);
  }, /*min_n=*/64 * 1024);
}

CpuGpt::CpuGpt(const ModelConfig& config, int B, int T, ThreadPool* pool)
    : config_(config), layout_(config), B_(B), T_(T), pool_(pool) {
  const size_t L = config.num_layers, C = config.channels, V = config.vocab_size;
  const size_t NH = config.num_heads, BT = static_cast<size_t>(B) * T;
  encoded_.resize(BT * C);
  ln1_.resize(L * BT * C);
  ln1_mean_.resize(L * BT);
  ln1_rstd_.resize(L * BT);
  qkv_.resize(L * BT * 3 * C);
  atty_.resize(L * BT * C);
  preatt_.resize(L * B * NH * T * T);
  att_.resize(L * B * NH * T * T);
  attproj_.resize(L * BT * C);
  residual2_.resize(L * BT * C);
  ln2_.resize(L * BT * C);
  ln2_mean_.resize(L * BT);
  ln2_rstd_.resize(L * BT);
  fch_.resize(L * BT * 4 * C);
  fch_gelu_.resize(L * BT * 4 * C);
  fcproj_.resize(L * BT * C);
  residual3_.resize(L * BT * C);
  acts_ = {encoded_.data(), ln1_.data(),      ln1_mean_.data(),  ln1_rstd_.data(),
           qkv_.data(),     atty_.data(),     preatt_.data(),    att_.data(),
           attproj_.data(), residual2_.data(), ln2_.data(),      ln2_mean_.data(),
           ln2_rstd_.data(), fch_.data(),     fch_gelu_.data(),  fcproj_.data(),
           residual3_.data()};
  lnf_.resize(BT * C);
  lnf_mean_.resize(BT);
  lnf_rstd_.resize(BT);
  logits_.resize(BT * V);
  probs_.resize(BT * V);
  losses_.resize(BT);
  for (auto* v : {&dres_, &dres_prev_, &dres2_, &dln_, &datty_, &dattproj_, &dfcproj_}) {
    v->resize(BT * C);
  }
  dqkv_.resize(BT * 3 * C);
  dpreatt_.resize(static_cast<size_t>(B) * NH * T * T);
  datt_.resize(static_cast<size_t>(B) * NH * T * T);
  dfch_.resize(BT * 4 * C);
  dfch_gelu_.resize(BT * 4 * C);
  dlogits_.resize(BT * V);
}

double CpuGpt::Forward(const float* params, const int32_t* inputs, const int32_t* targets) {
  const int B = B_, T = T_, C = config_.channels, NH = config_.num_heads;
  const int V = config_.vocab_size, BT = B * T;
  const size_t sC = static_cast<size_t>(BT) * C;
  const size_t sAtt = static_cast<size_t>(B) * NH * T * T;
  const ParamViews p = layout_.Views(const_cast<float*>(params));
  ThreadPool* pool = pool_;
  EncoderForward(encoded_.data(), inputs, p.wte, p.wpe, B, T, C, pool);
  for (int l = 0; l < config_.num_layers; ++l) {
    const LayerActivations a = acts_.Layer(l, BT, C, sAtt);
    LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, a.residual, p.ln1w + l * C, p.ln1b + l * C,
                     BT, C, pool);
    MatmulForward(a.qkv, a.ln1, p.qkvw + l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C, pool);
    AttentionForward(a.atty, a.preatt, a.att, a.qkv, B, T, C, NH, pool);
    MatmulForward(a.attproj, a.atty, p.attprojw + l * C * C, p.attprojb + l * C, BT, C, C, pool);
    ResidualForward(a.residual2, a.residual, a.attproj, BT * C, pool);
    LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w + l * C, p.ln2b + l * C,
                     BT, C, pool);
    MatmulGeluForward(a.fch, a.fch_gelu, a.ln2, p.fcw + l * 4 * C * C, p.fcb + l * 4 * C, BT, C,
                      4 * C, pool);
    MatmulForward(a.fcproj, a.fch_gelu, p.fcprojw + l * 4 * C * C, p.fcprojb + l * C, BT, 4 * C,
                  C, pool);
    ResidualForward(a.residual3, a.residual2, a.fcproj, BT * C, pool);
  }
  const float* last = residual3_.data() + (config_.num_layers - 1) * sC;
  LayerNormForward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), last, p.lnfw, p.lnfb, BT, C,
                   pool);
  MatmulForward(logits_.data(), lnf_.data(), p.wte, nullptr, BT, C, V, pool);
  SoftmaxForward(probs_.data(), logits_.data(), BT, V, pool);
  CrossEntropyForward(losses_.data(), probs_.data(), targets, BT, V, pool);
  double sum = 0.0;
  for (int i = 0; i < BT; ++i) sum += losses_[i];
  return sum;
}

double CpuGpt::ForwardBackward(const float* params, float* grads, const int32_t* inputs,
                               const int32_t* targets, float dloss) {
  const double loss = Forward(params, inputs, targets);
  Backward(params, grads, inputs, targets, dloss);
  return loss;
}

void CpuGpt::Backward(const float* params, float* grads, const int32_t* inputs,
                      const int32_t* targets, float dloss) {
  const int B = B_, T = T_, C = config_.channels, NH = config_.num_heads;
  const int V = config_.vocab_size, BT = B * T, L = config_.num_layers;
  const size_t sC = static_cast<size_t>(BT) * C;
  const size_t sAtt = static_cast<size_t>(B) * NH * T * T;
  const ParamViews p = layout_.Views(const_cast<float*>(params));
  const ParamViews g = layout_.Views(grads);

  ThreadPool* pool = pool_;
  Zero(dlogits_);
  Zero(dln_);
  Zero(dres_);
  CrossEntropySoftmaxBackward(dlogits_.data(), probs_.data(), targets, dloss, BT, V, pool);
  MatmulBackward(dln_.data(), g.wte, nullptr, dlogits_.data(), lnf_.data(), p.wte, BT, C, V,
                 pool);
  const float* last = residual3_.data() + (L - 1) * sC;
  LayerNormBackward(dres_.data(), g.lnfw, g.lnfb, dln_.data(), last, p.lnfw, lnf_mean_.data(),
                    lnf_rstd_.data(), BT, C, pool);

  for (int l = L - 1; l >= 0; --l) {
    const LayerActivations a = acts_.Layer(l, BT, C, sAtt);
    // dpreatt_ and datt_ are overwritten by AttentionBackward.
    for (auto* v : {&dres_prev_, &dres2_, &dln_, &dqkv_, &datty_, &dattproj_, &dfch_,
                    &dfch_gelu_, &dfcproj_}) {
      Zero(*v);
    }
    // dres_ holds d(residual3[l]); dres_prev_ collects d(residual of this layer's input).
    ResidualBackward(dres2_.data(), dfcproj_.data(), dres_.data(), BT * C, pool);
    MatmulBackward(dfch_gelu_.data(), g.fcprojw + l * 4 * C * C, g.fcprojb + l * C,
                   dfcproj_.data(), a.fch_gelu, p.fcprojw + l * 4 * C * C, BT, 4 * C, C, pool);
    GeluBackward(dfch_.data(), a.fch, dfch_gelu_.data(), BT * 4 * C, pool);
    MatmulBackward(dln_.data(), g.fcw + l * 4 * C * C, g.fcb + l * 4 * C, dfch_.data(), a.ln2,
                   p.fcw + l * 4 * C * C, BT, C, 4 * C, pool);
    LayerNormBackward(dres2_.data(), g.ln2w + l * C, g.ln2b + l * C, dln_.data(), a.residual2,
                      p.ln2w + l * C, a.ln2_mean, a.ln2_rstd, BT, C, pool);
    ResidualBackward(dres_prev_.data(), dattproj_.data(), dres2_.data(), BT * C, pool);
    MatmulBackward(datty_.data(), g.attprojw + l * C * C, g.attprojb + l * C, dattproj_.data(),
                   a.atty, p.attprojw + l * C * C, BT, C, C, pool);
    AttentionBackward(dqkv_.data(), dpreatt_.data(), datt_.data(), datty_.data(), a.qkv, a.att,
                      B, T, C, NH, pool);
    Zero(dln_);
    MatmulBackward(dln_.data(), g.qkvw + l * 3 * C * C, g.qkvb + l * 3 * C, dqkv_.data(), a.ln1,
                   p.qkvw + l * 3 * C * C, BT, C, 3 * C, pool);
    LayerNormBackward(dres_prev_.data(), g.ln1w + l * C, g.ln1b + l * C, dln_.data(), a.residual,
                      p.ln1w + l * C, a.ln1_mean, a.ln1_rstd, BT, C, pool);
    dres_.swap(dres_prev_);
  }
  EncoderBackward(g.wte, g.wpe, dres_.data(), inputs, B, T, C, pool);
}

}  // namespace trainer
}  // namespace gradsnap
