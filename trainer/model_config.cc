#include "trainer/model_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsnap {
namespace trainer {
namespace {

ModelConfig Make(const char* name, int seq, int layers, int heads, int channels) {
  ModelConfig c;
  c.name = name;
  c.vocab_size = 256;
  c.max_seq_len = seq;
  c.num_layers = layers;
  c.num_heads = heads;
  c.channels = channels;
  return c;
}

std::vector<ModelConfig> AllConfigs() {
  return {
      Make("tiny", 32, 2, 2, 64),         // ~0.11M parameters
      Make("small", 256, 6, 6, 384),      // ~10.8M parameters
      Make("gpt2-124m", 1024, 12, 12, 768),
      Make("gpt2-350m", 1024, 24, 16, 1024),
      Make("gpt2-774m", 1024, 36, 20, 1280),
      Make("gpt2-1558m", 1024, 48, 25, 1600),
  };
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigByName(absl::string_view name) {
  for (const ModelConfig& c : AllConfigs()) {
    if (c.name == name) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", name, "' (known: ",
                                                 absl::StrJoin(ModelConfigNames(), ", "), ")"));
}

std::vector<std::string> ModelConfigNames() {
  std::vector<std::string> names;
  for (const ModelConfig& c : AllConfigs()) names.push_back(c.name);
  return names;
}

std::string ModelConfigString(const ModelConfig& c) {
  return absl::StrCat("name=", c.name, " vocab=", c.vocab_size, " seq=", c.max_seq_len,
                      " layers=", c.num_layers, " heads=", c.num_heads, " channels=", c.channels);
}

ParamLayout::ParamLayout(const ModelConfig& c) {
  const int64_t V = c.vocab_size, T = c.max_seq_len, L = c.num_layers, C = c.channels;
  auto add = [&](const char* name, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    tensors_.push_back(ParamTensor{name, std::move(shape), total_, n});
    total_ += n;
  };
  add("wte", {V, C});
  add("wpe", {T, C});
  add("ln1w", {L, C});
  add("ln1b", {L, C});
  add("qkvw", {L, 3 * C, C});
  add("qkvb", {L, 3 * C});
  add("attprojw", {L, C, C});
  add("attprojb", {L, C});
  add("ln2w", {L, C});
  add("ln2b", {L, C});
  add("fcw", {L, 4 * C, C});
  add("fcb", {L, 4 * C});
  add("fcprojw", {L, C, 4 * C});
  add("fcprojb", {L, C});
  add("lnfw", {C});
  add("lnfb", {C});
}

ParamViews ParamLayout::Views(float* base) const {
  float* p[16];
  for (int i = 0; i < 16; ++i) p[i] = base + tensors_[i].offset;
  return ParamViews{p[0], p[1], p[2],  p[3],  p[4],  p[5],  p[6],  p[7],
                    p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]};
}

}  // namespace trainer
}  // namespace gradsnap
