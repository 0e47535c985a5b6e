// GPT forward/backward on the CPU; the layer sequence of llm.c's gpt2_forward/gpt2_backward.
#include "trainer/cpu_gpt.h"

#include <algorithm>

#include "trainer/cpu_layers.h"

namespace gradsnap {
namespace trainer {
namespace {

void Zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }

}  // namespace

CpuGpt::CpuGpt(const ModelConfig& config, int B, int T)
    : config_(config), layout_(config), B_(B), T_(T) {
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
  const size_t sC = static_cast<size_t>(BT) * C, sT = static_cast<size_t>(BT);
  const size_t sAtt = static_cast<size_t>(B) * NH * T * T;
  const ParamViews p = layout_.Views(const_cast<float*>(params));
  EncoderForward(encoded_.data(), inputs, p.wte, p.wpe, B, T, C);
  for (int l = 0; l < config_.num_layers; ++l) {
    const float* residual = l == 0 ? encoded_.data() : residual3_.data() + (l - 1) * sC;
    float* ln1 = ln1_.data() + l * sC;
    float* qkv = qkv_.data() + l * 3 * sC;
    float* atty = atty_.data() + l * sC;
    float* attproj = attproj_.data() + l * sC;
    float* res2 = residual2_.data() + l * sC;
    float* ln2 = ln2_.data() + l * sC;
    float* fch = fch_.data() + l * 4 * sC;
    float* fch_gelu = fch_gelu_.data() + l * 4 * sC;
    float* fcproj = fcproj_.data() + l * sC;
    LayerNormForward(ln1, ln1_mean_.data() + l * sT, ln1_rstd_.data() + l * sT, residual,
                     p.ln1w + l * C, p.ln1b + l * C, BT, C);
    MatmulForward(qkv, ln1, p.qkvw + l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C);
    AttentionForward(atty, preatt_.data() + l * sAtt, att_.data() + l * sAtt, qkv, B, T, C, NH);
    MatmulForward(attproj, atty, p.attprojw + l * C * C, p.attprojb + l * C, BT, C, C);
    ResidualForward(res2, residual, attproj, BT * C);
    LayerNormForward(ln2, ln2_mean_.data() + l * sT, ln2_rstd_.data() + l * sT, res2,
                     p.ln2w + l * C, p.ln2b + l * C, BT, C);
    MatmulForward(fch, ln2, p.fcw + l * 4 * C * C, p.fcb + l * 4 * C, BT, C, 4 * C);
    GeluForward(fch_gelu, fch, BT * 4 * C);
    MatmulForward(fcproj, fch_gelu, p.fcprojw + l * 4 * C * C, p.fcprojb + l * C, BT, 4 * C, C);
    ResidualForward(residual3_.data() + l * sC, res2, fcproj, BT * C);
  }
  const float* last = residual3_.data() + (config_.num_layers - 1) * sC;
  LayerNormForward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), last, p.lnfw, p.lnfb, BT, C);
  MatmulForward(logits_.data(), lnf_.data(), p.wte, nullptr, BT, C, V);
  SoftmaxForward(probs_.data(), logits_.data(), BT, V);
  CrossEntropyForward(losses_.data(), probs_.data(), targets, BT, V);
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
  const size_t sC = static_cast<size_t>(BT) * C, sT = static_cast<size_t>(BT);
  const size_t sAtt = static_cast<size_t>(B) * NH * T * T;
  const ParamViews p = layout_.Views(const_cast<float*>(params));
  const ParamViews g = layout_.Views(grads);

  Zero(dlogits_);
  Zero(dln_);
  Zero(dres_);
  CrossEntropySoftmaxBackward(dlogits_.data(), probs_.data(), targets, dloss, BT, V);
  MatmulBackward(dln_.data(), g.wte, nullptr, dlogits_.data(), lnf_.data(), p.wte, BT, C, V);
  const float* last = residual3_.data() + (L - 1) * sC;
  LayerNormBackward(dres_.data(), g.lnfw, g.lnfb, dln_.data(), last, p.lnfw, lnf_mean_.data(),
                    lnf_rstd_.data(), BT, C);

  for (int l = L - 1; l >= 0; --l) {
    const float* residual = l == 0 ? encoded_.data() : residual3_.data() + (l - 1) * sC;
    for (auto* v : {&dres_prev_, &dres2_, &dln_, &dqkv_, &datty_, &dpreatt_, &datt_, &dattproj_,
                    &dfch_, &dfch_gelu_, &dfcproj_}) {
      Zero(*v);
    }
    // dres_ holds d(residual3[l]); dres_prev_ collects d(residual of this layer's input).
    ResidualBackward(dres2_.data(), dfcproj_.data(), dres_.data(), BT * C);
    MatmulBackward(dfch_gelu_.data(), g.fcprojw + l * 4 * C * C, g.fcprojb + l * C,
                   dfcproj_.data(), fch_gelu_.data() + l * 4 * sC, p.fcprojw + l * 4 * C * C, BT,
                   4 * C, C);
    GeluBackward(dfch_.data(), fch_.data() + l * 4 * sC, dfch_gelu_.data(), BT * 4 * C);
    MatmulBackward(dln_.data(), g.fcw + l * 4 * C * C, g.fcb + l * 4 * C, dfch_.data(),
                   ln2_.data() + l * sC, p.fcw + l * 4 * C * C, BT, C, 4 * C);
    LayerNormBackward(dres2_.data(), g.ln2w + l * C, g.ln2b + l * C, dln_.data(),
                      residual2_.data() + l * sC, p.ln2w + l * C, ln2_mean_.data() + l * sT,
                      ln2_rstd_.data() + l * sT, BT, C);
    ResidualBackward(dres_prev_.data(), dattproj_.data(), dres2_.data(), BT * C);
    MatmulBackward(datty_.data(), g.attprojw + l * C * C, g.attprojb + l * C, dattproj_.data(),
                   atty_.data() + l * sC, p.attprojw + l * C * C, BT, C, C);
    AttentionBackward(dqkv_.data(), dpreatt_.data(), datt_.data(), datty_.data(),
                      qkv_.data() + l * 3 * sC, att_.data() + l * sAtt, B, T, C, NH);
    Zero(dln_);
    MatmulBackward(dln_.data(), g.qkvw + l * 3 * C * C, g.qkvb + l * 3 * C, dqkv_.data(),
                   ln1_.data() + l * sC, p.qkvw + l * 3 * C * C, BT, C, 3 * C);
    LayerNormBackward(dres_prev_.data(), g.ln1w + l * C, g.ln1b + l * C, dln_.data(), residual,
                      p.ln1w + l * C, ln1_mean_.data() + l * sT, ln1_rstd_.data() + l * sT, BT,
                      C);
    dres_.swap(dres_prev_);
  }
  EncoderBackward(g.wte, g.wpe, dres_.data(), inputs, B, T, C);
}

}  // namespace trainer
}  // namespace gradsnap
