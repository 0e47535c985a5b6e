#include "common/names.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"

namespace gradsnap {

absl::Status ValidateName(absl::string_view name, absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    std::string shown(name.substr(0, 64));
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " \"", absl::CHexEscape(shown),
                     name.size() > 64 ? "...\"" : "\"", ": ", why));
  };
  if (name.empty()) return bad("empty");
  if (name.size() > kMaxNameLength) return bad("longer than 128 characters");
  if (name == "." || name == "..") return bad("reserved");
  for (char c : name) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return bad("allowed characters are A-Z a-z 0-9 . _ -");
  }
  return absl::OkStatus();
}

}  // namespace gradsnap
