#include "recovery/state_text.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/key_value_text.h"

namespace gradsnap {
namespace recovery {

absl::StatusOr<std::map<std::string, std::string>> ParseStateText(absl::string_view text) {
  absl::StatusOr<std::map<std::string, std::string>> kv = ParseKeyValueText(text, kStateVersionLine);
  if (!kv.ok()) {
    return absl::DataLossError("not a gradsnap-train checkpoint (no train state version line)");
  }
  return kv;
}

absl::StatusOr<int64_t> StateInt(const std::map<std::string, std::string>& kv,
                                 const std::string& key) {
  auto it = kv.find(key);
  int64_t v = 0;
  if (it == kv.end() || !absl::SimpleAtoi(it->second, &v)) {
    return absl::DataLossError(absl::StrCat("train state: missing or bad ", key));
  }
  return v;
}

std::string SetStateField(absl::string_view text, absl::string_view key, absl::string_view value) {
  std::string out;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> p =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (p.first == key && line.find('=') != absl::string_view::npos) {
      absl::StrAppend(&out, key, "=", value, "\n");
      found = true;
    } else {
      absl::StrAppend(&out, line, "\n");
    }
  }
  if (!found) absl::StrAppend(&out, key, "=", value, "\n");
  return out;
}

}  // namespace recovery
}  // namespace gradsnap
