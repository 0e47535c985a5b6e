// GPT model configurations and the layout of the flat parameter buffer (llm.c style).
//
// All parameters live in ONE fp32 buffer; each named tensor is a view [offset, offset+numel).
// Gradients and the AdamW moments use the same layout, so snapshotting, sharding (ZeRO-1
// slices) and hashing are slices of flat buffers. The order of tensors below is part of the
// checkpoint format (docs/trainer.md): never reorder, only append new configurations.
//
// Thread safety: plain values; immutable after construction.
#ifndef GRADSNAP_TRAINER_MODEL_CONFIG_H_
#define GRADSNAP_TRAINER_MODEL_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/rank_slice.h"

namespace gradsnap {
namespace trainer {

struct ModelConfig {
  std::string name;     // "tiny", "small", "gpt2-124m", ...
  int vocab_size = 256;  // byte-level vocabulary
  int max_seq_len = 64;  // positions
  int num_layers = 2;
  int num_heads = 2;
  int channels = 64;  // C; head size C / num_heads
};

// The named configurations: tiny (<1M params, tests), small (~10M, CPU demo), gpt2-124m,
// gpt2-350m, gpt2-774m, gpt2-1558m (GPUs). INVALID_ARGUMENT for an unknown name.
absl::StatusOr<ModelConfig> ModelConfigByName(absl::string_view name);
std::vector<std::string> ModelConfigNames();

// "name=tiny vocab=256 seq=64 layers=2 heads=2 channels=64": stored in every checkpoint; a
// resume with a different config is refused by comparing these strings.
std::string ModelConfigString(const ModelConfig& c);

// One parameter tensor's place in the flat buffer.
struct ParamTensor {
  std::string name;            // "wte", "h3.attn_qkv_w", ...
  std::vector<int64_t> shape;  // e.g. (3C, C)
  size_t offset = 0;           // element offset in the flat buffer
  size_t numel = 0;
};

// Pointers into a flat buffer, one per tensor kind; layer tensors are stacked over L.
// The same struct views parameters, gradients and moments (llm.c's ParameterTensors).
struct ParamViews {
  float* wte;       // (V, C)
  float* wpe;       // (maxT, C)
  float* ln1w;      // (L, C)
  float* ln1b;      // (L, C)
  float* qkvw;      // (L, 3C, C)
  float* qkvb;      // (L, 3C)
  float* attprojw;  // (L, C, C)
  float* attprojb;  // (L, C)
  float* ln2w;      // (L, C)
  float* ln2b;      // (L, C)
  float* fcw;       // (L, 4C, C)
  float* fcb;       // (L, 4C)
  float* fcprojw;   // (L, C, 4C)
  float* fcprojb;   // (L, C)
  float* lnfw;      // (C)
  float* lnfb;      // (C)
};

// The layout of the flat buffer: the 16 stacked tensors in the order of ParamViews.
class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& c);
  size_t total() const { return total_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  // Views into base[0, total()). Weight decay applies to every element (as in llm.c's CPU
  // trainer), so one AdamWStepParams describes a whole update.
  ParamViews Views(float* base) const;

 private:
  std::vector<ParamTensor> tensors_;
  size_t total_ = 0;
};


}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_MODEL_CONFIG_H_
