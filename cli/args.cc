#include "cli/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"

namespace gradsnap {
namespace cli {
namespace {

const FlagSpec* Find(const std::vector<FlagSpec>* specs, const std::string& name) {
  if (specs == nullptr) return nullptr;
  for (const FlagSpec& f : *specs) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<ParsedArgs> ParseArgs(int argc, char** argv, const std::vector<FlagSpec>& globals,
                                     CommandFlagsFn command_flags) {
  ParsedArgs out;
  const std::vector<FlagSpec>* cmd_specs = nullptr;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!flags_done && arg == "--") {
      flags_done = true;
      continue;
    }
    if (!flags_done && (arg == "--help" || arg == "-h")) {
      out.help = true;
      continue;
    }
    int64_t number = 0;
    if (flags_done || arg.size() < 2 || arg[0] != '-' || absl::SimpleAtoi(arg, &number)) {
      // A positional argument (a lone "-" or a negative number counts too).
      if (out.command.empty()) {
        out.command = arg;
        cmd_specs = command_flags(arg);
      } else {
        out.positional.push_back(arg);
      }
      continue;
    }
    if (arg[1] != '-') {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg, " (flags start with --)"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const FlagSpec* spec = Find(&globals, name);
    if (spec == nullptr) spec = Find(cmd_specs, name);
    if (spec == nullptr) {
      if (!out.command.empty() && command_flags != nullptr && cmd_specs == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unknown command ", out.command));
      }
      if (out.command.empty() && command_flags != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag --", name, " (command flags go after the command)"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, out.command.empty() ? "" : " for ", out.command));
    }
    if (spec->value.empty()) {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes no value"));
      }
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value (", spec->value, ")"));
      }
      value = argv[++i];
      // "--out --json": the value was left out and the next flag would be taken for it.
      if (value.size() > 2 && value[0] == '-' && value[1] == '-') {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value (", spec->value, "), not the flag ",
                         value, " (write --", name, "=", value, " if that is the value)"));
      }
    }
    out.flags[name] = value;
  }
  return out;
}

absl::StatusOr<int64_t> ParseInt(const std::string& s, int64_t lo, int64_t hi,
                                 const std::string& what) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(s, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", what, " '", s, "': want an integer in [", lo, ", ", hi, "]"));
  }
  return v;
}

}  // namespace cli
}  // namespace gradsnap
