// The trainer's replicated small state as the recovery library sees it: text of a version line
// and "key=value" lines (trainer/train_state.h writes it; docs/trainer.md lists the keys). The
// library reads the few keys it needs (step, world size, the model layout) and rewrites the
// world size when it reshards; everything else passes through unchanged.
//
// THREAD SAFETY
//   Plain functions.
#ifndef GRADSNAP_RECOVERY_STATE_TEXT_H_
#define GRADSNAP_RECOVERY_STATE_TEXT_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {
namespace recovery {

inline constexpr absl::string_view kStateVersionLine = "gradsnap-train-state v1";
// The key of the encoded model layout (layout.h).
inline constexpr absl::string_view kParamLayoutKey = "param_layout";

// key -> value. DATA_LOSS when the version line is missing (not a gradsnap-train checkpoint).
absl::StatusOr<std::map<std::string, std::string>> ParseStateText(absl::string_view text);
// The value of an integer key; DATA_LOSS when missing or malformed.
absl::StatusOr<int64_t> StateInt(const std::map<std::string, std::string>& kv,
                                 const std::string& key);
// `text` with key's value replaced (appended when absent).
std::string SetStateField(absl::string_view text, absl::string_view key, absl::string_view value);

}  // namespace recovery
}  // namespace gradsnap

#endif  // GRADSNAP_RECOVERY_STATE_TEXT_H_
