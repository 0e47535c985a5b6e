#include "common/config_file.h"

#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace gradsnap {
namespace {

// The line without its comment: from a '#' that starts the line or follows a blank.
absl::string_view StripComment(absl::string_view line) {
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.substr(0, i);
    }
  }
  return line;
}

bool IsKey(absl::string_view key) {
  if (key.empty() || key[0] == '-') return false;
  for (char c : key) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<ConfigEntry>> ParseConfigText(absl::string_view text) {
  std::vector<ConfigEntry> entries;
  std::set<std::string> seen;  // keys with dashes as underscores
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    absl::string_view line = absl::StripAsciiWhitespace(StripComment(raw));
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": expected 'key = value', got '", line, "'"));
    }
    ConfigEntry e;
    e.key = std::string(absl::StripAsciiWhitespace(line.substr(0, eq)));
    e.value = std::string(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    e.line = number;
    if (!IsKey(e.key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", number, ": bad key '", e.key, "' (a flag name without its dashes)"));
    }
    if (!seen.insert(absl::StrReplaceAll(e.key, {{"-", "_"}})).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": key '", e.key, "' given twice"));
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

}  // namespace gradsnap
