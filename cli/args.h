// Command-line parsing of the gradsnap CLI (docs/cli.md).
//
// Grammar: gradsnap [GLOBAL FLAGS] COMMAND [ARGS and COMMAND FLAGS]. Global flags may also
// appear after the command; command flags only after it. Flags are `--name value` or
// `--name=value`; boolean flags take no value. `--` ends flag parsing. Hand-rolled rather than
// absl flags so each command has its own flag set and --help.
#ifndef GRADSNAP_CLI_ARGS_H_
#define GRADSNAP_CLI_ARGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsnap {
namespace cli {

struct FlagSpec {
  std::string name;      // without the leading "--"
  std::string value;     // placeholder shown in help ("N", "FILE"); empty for a boolean flag
  std::string help;      // one line, ending with the default
};

struct ParsedArgs {
  std::string command;                       // empty when none was given
  std::vector<std::string> positional;       // after the command
  std::map<std::string, std::string> flags;  // name -> value ("true" for booleans)
  bool help = false;                         // --help / -h anywhere

  bool Has(const std::string& name) const { return flags.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& def = "") const {
    auto it = flags.find(name);
    return it == flags.end() ? def : it->second;
  }
};

// Looks up the command flag set of `command` (nullptr when the command is unknown).
using CommandFlagsFn = const std::vector<FlagSpec>* (*)(const std::string& command);

// Parses argv[1..argc). INVALID_ARGUMENT with a one-line reason for unknown flags, missing
// values, or a command flag given before the command.
absl::StatusOr<ParsedArgs> ParseArgs(int argc, char** argv, const std::vector<FlagSpec>& globals,
                                     CommandFlagsFn command_flags);

// Parses a decimal integer within [lo, hi]; INVALID_ARGUMENT naming `what` otherwise.
absl::StatusOr<int64_t> ParseInt(const std::string& s, int64_t lo, int64_t hi,
                                 const std::string& what);

}  // namespace cli
}  // namespace gradsnap

#endif  // GRADSNAP_CLI_ARGS_H_
