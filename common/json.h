// Minimal JSON: quoting strings for what gradsnap writes (the CLI's --json output, safetensors
// headers, restore manifests), and a small reader for the files gradsnap itself writes and reads
// back (safetensors headers, a restore directory's manifest.json). The reader takes strict
// RFC 8259 syntax; numbers are kept as their text. Nesting is bounded, so hostile input cannot
// exhaust the stack.
//
// THREAD SAFETY
//   Plain values and functions.
#ifndef GRADSNAP_COMMON_JSON_H_
#define GRADSNAP_COMMON_JSON_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {

// `s` as a quoted JSON string: ", \ and control characters escaped; bytes >= 0x80 are passed
// through (callers hand in UTF-8 or ASCII).
std::string JsonQuote(absl::string_view s);

// A parsed JSON value.
struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  std::string text;  // a string's value, or a number's text
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;

  // The member `key` of an object, or nullptr.
  const JsonValue* Find(const std::string& key) const;
  // A number as an unsigned / signed integer; false when not one.
  bool AsUint(uint64_t* v) const;
  bool AsInt(int64_t* v) const;
};

// DATA_LOSS (naming `what`) on a syntax error or trailing bytes.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text, absl::string_view what);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_JSON_H_
