#include "tests/testing/trainer.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace testing {

RunResult RunTrainer(const std::string& binary, const std::string& args) {
  return RunCommand(binary + " " + args);
}

std::map<int64_t, std::string> ParseLosses(const std::string& output) {
  std::map<int64_t, std::string> losses;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string w1, w3, loss;
    int64_t step;
    if (ls >> w1 >> step >> w3 >> loss && w1 == "step" && w3 == "loss") losses[step] = loss;
  }
  return losses;
}

std::string SummaryField(const std::string& output, const std::string& key) {
  std::string summary;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("summary ", 0) == 0) summary = line;
  }
  const std::string want = " " + key + "=";
  const size_t at = summary.find(want);
  if (at == std::string::npos) return "";
  const size_t begin = at + want.size();
  return summary.substr(begin, summary.find(' ', begin) - begin);
}

namespace {

// One "step N loss L key value ..." line; false for any other line.
bool ParseStepLine(const std::string& line, StepLine* l) {
  std::istringstream ls(line);
  std::string word, loss;
  if (!(ls >> word >> l->step) || word != "step" || !(ls >> word >> loss) || word != "loss") {
    return false;
  }
  while (ls >> word) {
    if (word == "skipped") continue;
    std::string value;
    if (!(ls >> value)) break;
    if (word == "step_ms") l->step_ms = std::atof(value.c_str());
    if (word == "stall_ms") l->stall_ms = std::atof(value.c_str());
    if (word == "ckpt_failures") l->ckpt_failures = std::atoll(value.c_str());
    if (word == "recovery_point") l->recovery_point = std::atoll(value.c_str());
    if (word == "recovery_age_s") l->recovery_age_s = std::atof(value.c_str());
  }
  return true;
}

}  // namespace

std::vector<StepLine> ParseStepLines(const std::string& output) {
  std::vector<StepLine> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    StepLine l;
    if (ParseStepLine(line, &l)) out.push_back(l);
  }
  return out;
}

StepLine LastStepLine(const std::string& output) {
  size_t end = output.size();
  while (end > 0) {
    const size_t nl = end >= 2 ? output.rfind('\n', end - 2) : std::string::npos;
    const size_t begin = nl == std::string::npos ? 0 : nl + 1;
    if (output.compare(begin, 5, "step ") == 0) {
      StepLine l;
      if (ParseStepLine(output.substr(begin, end - begin), &l)) return l;
    }
    end = begin;
  }
  return StepLine{};
}

StepLine LastStepLine(const ChildProcess& job) { return LastStepLine(job.Output()); }

StepWindow StepsBetween(const std::vector<StepLine>& lines, int64_t first, int64_t last) {
  StepWindow w;
  double total = 0;
  for (const StepLine& l : lines) {
    if (l.step < first || l.step > last) continue;
    ++w.steps;
    total += l.step_ms;
    w.max_stall_ms = std::max(w.max_stall_ms, l.stall_ms);
  }
  if (w.steps > 0) w.mean_step_ms = total / w.steps;
  return w;
}

absl::Status ResumedExactly(const std::string& reference, const std::string& resumed,
                            int64_t from) {
  const std::string resumed_from = SummaryField(resumed, "resumed_from");
  if (resumed_from != std::to_string(from)) {
    return absl::InternalError(absl::StrCat("resumed_from=", resumed_from, ", not ", from));
  }
  const std::string want = SummaryField(reference, "params_sha256");
  const std::string got = SummaryField(resumed, "params_sha256");
  if (want.empty() || want != got) {
    return absl::InternalError("params_sha256 " + got + " where the reference has " + want);
  }
  const std::map<int64_t, std::string> a = ParseLosses(reference), b = ParseLosses(resumed);
  int compared = 0;
  for (auto it = a.upper_bound(from); it != a.end(); ++it, ++compared) {
    auto other = b.find(it->first);
    if (other == b.end() || other->second != it->second) {
      return absl::InternalError(absl::StrCat("step ", it->first, " loss ",
                                              other == b.end() ? "missing" : other->second,
                                              " where the reference has ", it->second));
    }
  }
  if (compared == 0) return absl::InternalError(absl::StrCat("no step after ", from));
  return absl::OkStatus();
}

absl::Status ResumedFrom(const RunResult& run, int64_t from) {
  const std::string resumed_from = SummaryField(run.out, "resumed_from");
  if (run.exit_code == 0 && resumed_from == std::to_string(from)) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("exit ", run.exit_code, ", resumed_from=",
                                          resumed_from, " (want exit 0, resumed_from=", from,
                                          "):\n", run.out));
}

}  // namespace testing
}  // namespace gradsnap
