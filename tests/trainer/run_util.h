// Helpers for the trainer's end-to-end tests: run a command, parse gradsnap-train's output.
#ifndef GRADSNAP_TESTS_TRAINER_RUN_UTIL_H_
#define GRADSNAP_TESTS_TRAINER_RUN_UTIL_H_

#include <cstdint>
#include <map>
#include <string>

namespace gradsnap {
namespace testing {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal or could not run
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` through /bin/sh with stderr folded into stdout.
RunResult RunCommand(const std::string& command);

// "step S loss L ..." lines: step -> loss text (exact, as printed).
std::map<int64_t, std::string> ParseLosses(const std::string& output);
// The value of `key=` in the summary line, or "" if absent.
std::string SummaryField(const std::string& output, const std::string& key);

// A fresh, empty directory under the test temp dir.
std::string FreshDir(const std::string& name);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TRAINER_RUN_UTIL_H_
