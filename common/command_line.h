// How every gradsnap main() parses its Abseil flags: the usage message, --help listing only the
// program's own flags (not Abseil's or gRPC's), dash spellings (--data-dir) accepted as the
// flag names' underscores (flag_names.h), and optionally a config file of flags
// (config_file.h). Target gradsnap::command_line: only binaries link it,
// so the libraries stay free of Abseil's flag parser.
//
// THREAD SAFETY: not thread-safe; build one in main() before any other thread starts.
#ifndef GRADSNAP_COMMON_COMMAND_LINE_H_
#define GRADSNAP_COMMON_COMMAND_LINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
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
  //
  // `config_flag`: the name of a string flag of the program ("config") whose value, when not
  // empty, names a config file (config_file.h): its entries are parsed as "--key=value" before
  // the command line's flags, which therefore win. Keys are the program's own flags (those of
  // its `flag_files`) except `config_flag`. A file that cannot be read or parsed, an unknown key
  // or a bad value exits with one line ("PROGRAM: FILE:LINE: unknown key 'x' (see PROGRAM
  // --help)") and status `bad_flag_exit`. Empty: no config file.
  std::vector<char*> Parse(int bad_flag_exit = 2, absl::string_view config_flag = "");

  // FlagArgumentsError over the arguments as given.
  std::string FlagError() const;

 private:
  // What is wrong with the config file `path` for this program (one line), or the flag
  // arguments it stands for ("--key=value", in file order) in *out.
  std::string ConfigError(const std::string& path, absl::string_view config_flag,
                          std::vector<std::string>* out) const;
  [[noreturn]] void ExitWith(const std::string& error, int code) const;

  std::vector<std::string> typed_;  // the arguments as given
  std::vector<std::string> flag_files_;
  UnderscoredArgv argv_;
  // argv[0], the config file's flags, then the command line's (when there is a config file).
  std::unique_ptr<UnderscoredArgv> expanded_;
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_COMMAND_LINE_H_
