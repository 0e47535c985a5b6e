#include "common/command_line.h"

#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"

namespace gradsnap {

CommandLine::CommandLine(int argc, char** argv, const char* usage, const char* main_file)
    : argv_(argc, argv) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [file = std::string(main_file)](absl::string_view f) {
    return f.find(file) != absl::string_view::npos;
  };
  absl::SetFlagsUsageConfig(config);
}

std::vector<char*> CommandLine::Parse() {
  return absl::ParseCommandLine(argv_.argc(), argv_.argv());
}

}  // namespace gradsnap
