// The activations a GPT keeps for its backward pass (llm.c's ActivationTensors), as one layer
// sees them. Each kind is one buffer for all L layers, (L, B, T, ...), and layer l's slice
// starts l per-layer sizes in. The CPU back end's buffers are host memory and the CUDA back
// end's device memory; the slicing arithmetic is this one, for both.
//
// Thread safety: plain values.
#ifndef GRADSNAP_TRAINER_LAYER_ACTIVATIONS_H_
#define GRADSNAP_TRAINER_LAYER_ACTIVATIONS_H_

#include <cstddef>

namespace gradsnap {
namespace trainer {

// Layer l's slices. `residual` is the layer's input: the encoder's output for layer 0, else
// layer l-1's residual3. The slices of layer 0 are where each buffer starts.
struct LayerActivations {
  const float* residual;  // (B,T,C)
  float* ln1;             // (B,T,C)
  float* ln1_mean;        // (B,T)
  float* ln1_rstd;        // (B,T)
  float* qkv;             // (B,T,3C)
  float* atty;            // (B,T,C)
  float* preatt;          // (B,NH,T,T)
  float* att;             // (B,NH,T,T)
  float* attproj;         // (B,T,C)
  float* residual2;       // (B,T,C)
  float* ln2;             // (B,T,C)
  float* ln2_mean;        // (B,T)
  float* ln2_rstd;        // (B,T)
  float* fch;             // (B,T,4C)
  float* fch_gelu;        // (B,T,4C)
  float* fcproj;          // (B,T,C)
  float* residual3;       // (B,T,C)

  // Layer l's slices, where *this holds layer 0's; for `bt` tokens (B*T) of `channels` (C)
  // and `att_size` (B*NH*T*T) attention scores per layer.
  LayerActivations Layer(int l, size_t bt, size_t channels, size_t att_size) const {
    const size_t sC = bt * channels, sT = bt, sAtt = att_size, ul = static_cast<size_t>(l);
    return LayerActivations{
        l == 0 ? residual : residual3 + (ul - 1) * sC,
        ln1 + ul * sC,
        ln1_mean + ul * sT,
        ln1_rstd + ul * sT,
        qkv + ul * 3 * sC,
        atty + ul * sC,
        preatt + ul * sAtt,
        att + ul * sAtt,
        attproj + ul * sC,
        residual2 + ul * sC,
        ln2 + ul * sC,
        ln2_mean + ul * sT,
        ln2_rstd + ul * sT,
        fch + ul * 4 * sC,
        fch_gelu + ul * 4 * sC,
        fcproj + ul * sC,
        residual3 + ul * sC,
    };
  }
};

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_LAYER_ACTIVATIONS_H_
