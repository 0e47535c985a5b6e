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

class CommandLine {
 public:
  // `usage`: the first line of --help. `flag_files`: parts of the names of the source files
  // that define the program's flags ({"server_main"}); --help lists the flags of matching files.
  CommandLine(int argc, char** argv, const char* usage, std::vector<std::string> flag_files);
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // The arguments with flag names underscored, argv[0] first; valid while this object lives.
  const std::vector<char*>& args() const { return argv_.args(); }

  // absl::ParseCommandLine over args(): exits on a bad flag or --help. Returns the positional
  // arguments, argv[0] first.
  std::vector<char*> Parse();

 private:
  UnderscoredArgv argv_;
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_COMMAND_LINE_H_
