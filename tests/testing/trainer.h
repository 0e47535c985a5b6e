// gradsnap-train for the tests and drills: run it, read its output ("step S loss L ..." lines
// and the final "summary k=v ..." line, docs/trainer.md).
#ifndef GRADSNAP_TESTS_TESTING_TRAINER_H_
#define GRADSNAP_TESTS_TESTING_TRAINER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/testing/process.h"
#include "tests/testing/util.h"  // CountLines

namespace gradsnap {
namespace testing {

// Runs `binary args` (args: shell words) to its exit; out holds stdout and stderr interleaved.
RunResult RunTrainer(const std::string& binary, const std::string& args);

// "step S loss L ..." lines: step -> loss text (exact, as printed).
std::map<int64_t, std::string> ParseLosses(const std::string& output);
// The value of `key=` in the last line starting "summary ", or "" if absent.
std::string SummaryField(const std::string& output, const std::string& key);
// One step line of rank 0: "step S loss L step_ms T stall_ms X [skipped] [ckpt_failures F
// ckpt_skipped K recovery_point R recovery_age_s A]" (docs/trainer.md); -1 where absent.
struct StepLine {
  int64_t step = 0;
  double step_ms = 0;
  double stall_ms = 0;
  int64_t ckpt_failures = -1;
  int64_t recovery_point = -1;
  double recovery_age_s = -1;
};
std::vector<StepLine> ParseStepLines(const std::string& output);
// The last step line of `output` (StepLine{}, step 0, when none), parsing only that line: for
// loops that poll a running job's output.
StepLine LastStepLine(const std::string& output);
// LastStepLine of a running job's output so far.
StepLine LastStepLine(const ChildProcess& job);

// The steps of `lines` in [first, last]: how many, their mean step_ms and their largest
// stall_ms (0 when none).
struct StepWindow {
  int steps = 0;
  double mean_step_ms = 0;
  double max_stall_ms = 0;
};
StepWindow StepsBetween(const std::vector<StepLine>& lines, int64_t first, int64_t last);

// OK when the run that printed `resumed` resumed from step `from` (its summary's resumed_from;
// never a restart from scratch), ended with the parameters of the uninterrupted run that
// printed `reference` (their params_sha256, present), and printed the same loss for every step
// after `from` that `reference` printed (one at least); otherwise what differs.
absl::Status ResumedExactly(const std::string& reference, const std::string& resumed, int64_t from);
// OK when `run` exited 0 and its summary says it resumed from step `from`; otherwise what
// differs, with the run's output.
absl::Status ResumedFrom(const RunResult& run, int64_t from);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_TRAINER_H_
