// A small JSON reader for the files gradsnap itself writes and reads back (safetensors headers,
// a restore directory's trainer_state.json). Strict RFC 8259 syntax; numbers are kept as their
// text. Nesting is bounded, so hostile input cannot exhaust the stack.
//
// THREAD SAFETY
//   Plain values and functions.
#ifndef GRADSNAP_RECOVERY_JSON_VALUE_H_
#define GRADSNAP_RECOVERY_JSON_VALUE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {
namespace recovery {

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

}  // namespace recovery
}  // namespace gradsnap

#endif  // GRADSNAP_RECOVERY_JSON_VALUE_H_
