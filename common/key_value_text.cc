#include "common/key_value_text.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradsnap {

absl::StatusOr<std::map<std::string, std::string>> ParseKeyValueText(
    absl::string_view text, absl::string_view version_line) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != version_line) {
    return absl::DataLossError(
        absl::StrCat("missing or unknown version line (expected '", version_line, "')"));
  }
  std::map<std::string, std::string> kv;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<std::string, std::string> p = absl::StrSplit(lines[i], absl::MaxSplits('=', 1));
    kv[p.first] = p.second;
  }
  return kv;
}

}  // namespace gradsnap
