#include "common/command_line.h"

#include <string>
#include <utility>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"

namespace gradsnap {

CommandLine::CommandLine(int argc, char** argv, const char* usage,
                         std::vector<std::string> flag_files)
    : argv_(argc, argv) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [files = std::move(flag_files)](absl::string_view f) {
    for (const std::string& file : files) {
      if (f.find(file) != absl::string_view::npos) return true;
    }
    return false;
  };
  absl::SetFlagsUsageConfig(config);
}

std::vector<char*> CommandLine::Parse() {
  return absl::ParseCommandLine(argv_.argc(), argv_.argv());
}

}  // namespace gradsnap
