#include "common/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/config_file.h"
#include "common/small_file.h"

namespace gradsnap {

CommandLine::CommandLine(int argc, char** argv, const char* usage,
                         std::vector<std::string> flag_files)
    : typed_(argv, argv + argc), flag_files_(std::move(flag_files)), argv_(argc, argv) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [files = flag_files_](absl::string_view f) {
    for (const std::string& file : files) {
      if (f.find(file) != absl::string_view::npos) return true;
    }
    return false;
  };
  absl::SetFlagsUsageConfig(config);
}

std::string FlagArgumentsError(const std::vector<std::string>& args) {
  // Abseil's own flags whose values ParseCommandLine acts on itself: not set here.
  auto acted_on = [](const std::string& name) {
    return name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok";
  };
  // Names --undefok lists (Abseil's own flag): those may be unknown.
  std::set<std::string> undefok;
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    std::string a = args[i];
    std::string value;
    if (absl::StartsWith(a, "--undefok=") || absl::StartsWith(a, "-undefok=")) {
      value = a.substr(a.find('=') + 1);
    } else if ((a == "--undefok" || a == "-undefok") && i + 1 < args.size()) {
      value = args[i + 1];
    }
    for (absl::string_view name : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      undefok.insert(absl::StrReplaceAll(name, {{"-", "_"}}));
    }
  }
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-' || a == "-") continue;  // a positional argument
    const size_t dashes = a[1] == '-' ? 2 : 1;
    const size_t eq = a.find('=');
    const std::string typed = a.substr(0, eq);  // "--data-dir"
    std::string name = absl::StrReplaceAll(typed.substr(dashes), {{"-", "_"}});
    // Abseil's usage flags (not in its flag registry): it prints the help and exits.
    if (name == "help" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
        name == "version" || name == "only_check_args" || name == "helpon" ||
        name == "helpmatch") {
      return "";
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {  // --nofoo for a bool foo
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        if (eq != std::string::npos) return absl::StrCat(typed, " takes no value");
        continue;
      }
    }
    if (flag == nullptr) {
      if (undefok.count(name) != 0 ||
          (absl::StartsWith(name, "no") && undefok.count(name.substr(2)) != 0)) {
        // Abseil skips it; a value given apart ("--x v") is then a positional argument.
        continue;
      }
      return absl::StrCat("unknown flag ", typed);
    }
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::StrCat("missing value for ", typed);
    }
    if (acted_on(name)) continue;
    std::string error;
    // Sets the flag, as ParseCommandLine will again with the same value.
    if (!flag->ParseFrom(value, &error)) {
      return absl::StrCat("bad value '", value, "' for ", typed);
    }
  }
  return "";
}

std::string CommandLine::FlagError() const { return FlagArgumentsError(typed_); }

std::string CommandLine::ConfigError(const std::string& path, absl::string_view config_flag,
                                     std::vector<std::string>* out) const {
  absl::StatusOr<std::string> text = ReadSmallFile(path, "config file");
  if (!text.ok()) return std::string(text.status().message());
  absl::StatusOr<std::vector<ConfigEntry>> entries = ParseConfigText(*text);
  if (!entries.ok()) return absl::StrCat(path, ": ", entries.status().message());
  const auto own = [this](const absl::CommandLineFlag& flag) {
    for (const std::string& file : flag_files_) {
      if (flag.Filename().find(file) != std::string::npos) return true;
    }
    return false;
  };
  for (const ConfigEntry& e : *entries) {
    const std::string where = absl::StrCat(path, ":", e.line, ": ");
    const std::string name = absl::StrReplaceAll(e.key, {{"-", "_"}});
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || !own(*flag)) return absl::StrCat(where, "unknown key '", e.key, "'");
    if (name == config_flag) return absl::StrCat(where, "a config file cannot name another");
    std::string error;
    // Sets the flag; ParseCommandLine sets it again, then the command line's value over it.
    if (!flag->ParseFrom(e.value, &error)) {
      return absl::StrCat(where, "bad value '", e.value, "' for key '", e.key, "'");
    }
    out->push_back(absl::StrCat("--", name, "=", e.value));
  }
  return "";
}

void CommandLine::ExitWith(const std::string& error, int code) const {
  std::string program = typed_.empty() ? "gradsnap" : typed_[0];
  program = program.substr(program.rfind('/') + 1);
  std::fprintf(stderr, "%s: %s (see %s --help)\n", program.c_str(), error.c_str(),
               program.c_str());
  std::exit(code);
}

std::vector<char*> CommandLine::Parse(int bad_flag_exit, absl::string_view config_flag) {
  const std::string error = FlagError();
  if (!error.empty()) ExitWith(error, bad_flag_exit);
  absl::CommandLineFlag* config =
      config_flag.empty() ? nullptr : absl::FindCommandLineFlag(config_flag);
  // FlagError has set the flags from the command line: the last --config given.
  const std::string path = config != nullptr ? config->CurrentValue() : "";
  if (path.empty()) return absl::ParseCommandLine(argv_.argc(), argv_.argv());
  std::vector<std::string> expanded = {typed_.empty() ? std::string("gradsnap") : typed_[0]};
  if (std::string e = ConfigError(path, config_flag, &expanded); !e.empty()) {
    ExitWith(e, bad_flag_exit);
  }
  expanded.insert(expanded.end(), typed_.begin() + std::min<size_t>(1, typed_.size()),
                  typed_.end());
  std::vector<char*> ptrs;
  for (std::string& a : expanded) ptrs.push_back(a.data());
  expanded_ = std::make_unique<UnderscoredArgv>(static_cast<int>(ptrs.size()), ptrs.data());
  return absl::ParseCommandLine(expanded_->argc(), expanded_->argv());
}

}  // namespace gradsnap
