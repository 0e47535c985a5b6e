// Text of a version line followed by "key=value" lines: the format of the trainer's replicated
// state (docs/trainer.md), written by trainer/train_state.cc and read there and by recovery/.
//
// THREAD SAFETY: plain functions.
#ifndef GRADSNAP_COMMON_KEY_VALUE_TEXT_H_
#define GRADSNAP_COMMON_KEY_VALUE_TEXT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {

// key -> value of the lines after the first (the value is everything after the first '='; a
// line without '=' has an empty value; a later line wins). DATA_LOSS when the first line is not
// `version_line`.
absl::StatusOr<std::map<std::string, std::string>> ParseKeyValueText(
    absl::string_view text, absl::string_view version_line);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_KEY_VALUE_TEXT_H_
