// Config files of the binaries (`gradsnap-server --config FILE`, docs/deploy.md, "Config file"):
// one flag per line as `key = value`, the key a flag's name without its dashes (dashes or
// underscores inside it), blank lines and comments ('#' at the start of a line or after a
// blank) ignored. CommandLine (command_line.h) turns each entry into "--key=value" placed before
// the command line's own flags, so a flag on the command line overrides the file, and validates
// each key and value with the registered flag's own parser, so every flag a program defines is
// a key, also those added later.
//
// THREAD SAFETY: plain functions.
#ifndef GRADSNAP_COMMON_CONFIG_FILE_H_
#define GRADSNAP_COMMON_CONFIG_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {

struct ConfigEntry {
  std::string key;    // as written ("data-dir" or "data_dir")
  std::string value;  // blanks around it removed; may be empty
  int line = 0;       // 1-based
};

// The entries of a config file's text, in order. INVALID_ARGUMENT "line N: ..." for a line that
// is not `key = value`, a key that is not [A-Za-z0-9_-]+ (a leading "--" is refused too: keys
// are names) or a key given twice.
absl::StatusOr<std::vector<ConfigEntry>> ParseConfigText(absl::string_view text);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_CONFIG_FILE_H_
