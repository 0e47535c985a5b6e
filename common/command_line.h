// How every gradsnap main() parses its Abseil flags: the usage message, --help listing only the
// program's own flags (not Abseil's or gRPC's), and dash spellings (--data-dir) accepted as the
// flag names' underscores (flag_names.h). Target gradsnap::command_line: only binaries link it,
// so the libraries stay free of Abseil's flag parser.
//
// THREAD SAFETY: not thread-safe; build one in main() before any other thread starts.
#ifndef GRADSNAP_COMMON_COMMAND_LINE_H_
#define GRADSNAP_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "common/flag_names.h"

namespace gradsnap {

// What is wrong with the flag arguments of `args` (argv[0] first, as typed; up to a lone "--"),
// in one line naming the flag as it was typed: "unknown flag --data-dri", "missing value for
// --steps", "bad value 'x' for --steps", "--nofoo takes no value"; empty when nothing is. Each
// value is parsed by its registered flag's own parser, which sets it (ParseCommandLine sets
// it again). Abseil's own messages span lines, name the flag with underscores and exit 1.
std::string FlagArgumentsError(const std::vector<std::string>& args);

class CommandLine {
 public:
  // `usage`: the first line of --help. `flag_files`: parts of the names of the source files
  // that define the program's flags ({"server_main"}); --help lists the flags of matching files.
  CommandLine(int argc, char** argv, const char* usage, std::vector<std::string> flag_files);
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // The arguments with flag names underscored, argv[0] first; valid while this object lives.
  const std::vector<char*>& args() const { return argv_.args(); }

  // absl::ParseCommandLine over args(): exits on --help, and on a bad flag with FlagError()'s
  // line ("PROGRAM: unknown flag --x (see PROGRAM --help)") and status `bad_flag_exit`.
  // Returns the positional arguments, argv[0] first.
  std::vector<char*> Parse(int bad_flag_exit = 2);

  // FlagArgumentsError over the arguments as given.
  std::string FlagError() const;

 private:
  std::vector<std::string> typed_;  // the arguments as given
  UnderscoredArgv argv_;
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_COMMAND_LINE_H_
