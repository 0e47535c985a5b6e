#include "trainer/model_layout.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace trainer {

std::vector<recovery::ParamEntry> NamedParams(const ModelConfig& config) {
  // ParamLayout name -> Hugging Face GPT-2 name ("%d": the layer).
  static const std::map<std::string, std::string> kNames = {
      {"wte", "wte.weight"},
      {"wpe", "wpe.weight"},
      {"ln1w", "h.%d.ln_1.weight"},
      {"ln1b", "h.%d.ln_1.bias"},
      {"qkvw", "h.%d.attn.c_attn.weight"},
      {"qkvb", "h.%d.attn.c_attn.bias"},
      {"attprojw", "h.%d.attn.c_proj.weight"},
      {"attprojb", "h.%d.attn.c_proj.bias"},
      {"ln2w", "h.%d.ln_2.weight"},
      {"ln2b", "h.%d.ln_2.bias"},
      {"fcw", "h.%d.mlp.c_fc.weight"},
      {"fcb", "h.%d.mlp.c_fc.bias"},
      {"fcprojw", "h.%d.mlp.c_proj.weight"},
      {"fcprojb", "h.%d.mlp.c_proj.bias"},
      {"lnfw", "ln_f.weight"},
      {"lnfb", "ln_f.bias"},
  };
  std::vector<recovery::ParamEntry> out;
  const ParamLayout layout(config);
  for (const ParamTensor& t : layout.tensors()) {
    const std::string& pattern = kNames.at(t.name);
    const size_t at = pattern.find("%d");
    if (at == std::string::npos) {
      out.push_back({pattern, t.shape, t.offset});
      continue;
    }
    // Stacked over layers: shape (L, rest...).
    const std::vector<int64_t> rest(t.shape.begin() + 1, t.shape.end());
    const size_t per = t.numel / static_cast<size_t>(t.shape[0]);
    for (int64_t l = 0; l < t.shape[0]; ++l) {
      out.push_back({absl::StrCat(pattern.substr(0, at), l, pattern.substr(at + 2)), rest,
                     t.offset + static_cast<size_t>(l) * per});
    }
  }
  return out;
}

std::string ModelLayoutText(const ModelConfig& config) {
  return recovery::EncodeLayout(NamedParams(config));
}

}  // namespace trainer
}  // namespace gradsnap
