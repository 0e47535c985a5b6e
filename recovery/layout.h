// The model layout that travels in checkpoint metadata (DESIGN.md section 3, "Resharding"):
// the named parameter tensors of the flat fp32 buffer, with their shapes and element offsets,
// so tools without trainer code (the CLI) can write parameters by name.
//
// ENCODING (docs/format.md, "Model layout")
//   One line, entries separated by ';', each "NAME:D0xD1x...:OFFSET" (a scalar has an empty
//   shape). Entries are in offset order and tile [0, total) without gaps. Names follow Hugging
//   Face GPT-2 ("h.0.attn.c_attn.weight"); shapes are the trainer's (llm.c, out x in).
//
// THREAD SAFETY
//   Plain values and functions.
#ifndef GRADSNAP_RECOVERY_LAYOUT_H_
#define GRADSNAP_RECOVERY_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {
namespace recovery {

struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // first element in the flat buffer
  uint64_t numel() const;
};

std::string EncodeLayout(const std::vector<ParamEntry>& entries);
// DATA_LOSS for a malformed encoding, overlapping or out-of-order entries, or duplicate names.
absl::StatusOr<std::vector<ParamEntry>> DecodeLayout(absl::string_view text);
// Elements covered by the layout (end of the last entry).
uint64_t LayoutTotal(const std::vector<ParamEntry>& entries);

}  // namespace recovery
}  // namespace gradsnap

#endif  // GRADSNAP_RECOVERY_LAYOUT_H_
