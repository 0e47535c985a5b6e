// Minimal JSON text helpers for the CLI's --json output and the safetensors header. Only
// writing; gradsnap never parses JSON in C++.
#ifndef GRADSNAP_CLIENT_JSON_H_
#define GRADSNAP_CLIENT_JSON_H_

#include <string>

#include "absl/strings/string_view.h"

namespace gradsnap {
namespace client {

// `s` as a quoted JSON string: ", \ and control characters escaped; bytes >= 0x80 are passed
// through (callers hand in UTF-8 or ASCII).
std::string JsonQuote(absl::string_view s);

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_JSON_H_
