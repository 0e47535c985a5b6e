// The model layout a checkpoint carries (recovery/layout.h): every parameter of the flat buffer
// by its Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight", with its shape and offset, so
// `gradsnap restore --consolidate` can write named weights without trainer code.
// Thread safety: a pure function.
#ifndef GRADSNAP_TRAINER_MODEL_LAYOUT_H_
#define GRADSNAP_TRAINER_MODEL_LAYOUT_H_

#include <string>
#include <vector>

#include "recovery/layout.h"
#include "trainer/model_config.h"

namespace gradsnap {
namespace trainer {

// The layer-stacked tensors of ParamLayout cut per layer, in flat-buffer order.
std::vector<recovery::ParamEntry> NamedParams(const ModelConfig& config);
// EncodeLayout(NamedParams(config)).
std::string ModelLayoutText(const ModelConfig& config);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_MODEL_LAYOUT_H_
