#include "benchmarks/fault_drill/training_scenario.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace drill {
namespace {

using ::gradsnap::testing::SummaryField;
using ::gradsnap::testing::SleepMs;

constexpr char kJob[] = "drill";

// The job's flags; `storage` empty: no checkpointing (the uninterrupted reference).
std::vector<std::string> TrainArgs(const TrainingDrillConfig& c, const std::string& storage,
                                   int64_t delay_ms, const std::string& resume,
                                   int64_t fail_at_step = 0) {
  std::vector<std::string> a = {c.train_bin, "--model=tiny",
                                absl::StrCat("--steps=", c.steps), "--nproc=2", "--batch=4",
                                "--seq=16", "--blas_threads=1"};
  if (storage.empty()) return a;
  a.insert(a.end(), {"--storage=" + storage, absl::StrCat("--job=", kJob), "--ckpt_mode=gockpt",
                     "--ckpt_every=8", "--gockpt_window=2", "--grad_log", "--max_restarts=3",
                     absl::StrCat("--ckpt_persist_timeout_ms=", c.persist_timeout_ms),
                     absl::StrCat("--test_step_delay_ms=", delay_ms), "--resume=" + resume});
  if (fail_at_step > 0) {
    a.insert(a.end(), {absl::StrCat("--fail_at_step=", fail_at_step), "--fail_rank=1"});
  }
  return a;
}

// The largest value of `value(match)` over the matches of `re` in `output` (0 when none).
template <typename F>
int64_t MaxOverMatches(const std::string& output, const std::regex& re, F value) {
  int64_t best = 0;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    best = std::max(best, value(*it));
  }
  return best;
}

// The largest (step - recovery_point) over the step lines once a recovery point exists: the
// steps a failure at that moment would have lost.
int64_t MaxRecoveryLag(const std::string& output) {
  static const std::regex re(R"((^|\n)step (\d+) .* recovery_point (-?\d+) )");
  return MaxOverMatches(output, re, [](const std::smatch& m) -> int64_t {
    const int64_t step = std::stoll(m[2]), rp = std::stoll(m[3]);
    return rp >= 0 ? step - rp : 0;
  });
}

// Every recovery point the step lines named (docs/trainer.md: "recovery_point N", -1 none).
std::set<int64_t> RecoveryPoints(const std::string& output) {
  static const std::regex re(R"((^|\n)step \d+ .* recovery_point (\d+) )");
  std::set<int64_t> out;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    out.insert(std::stoll((*it)[2]));
  }
  return out;
}

// Persists that failed over the whole job: each attempt counts its own (its step lines'
// ckpt_failures), so the attempts' counts are summed; the summary line has the last one's only.
int64_t CkptFailuresAllAttempts(const std::string& output) {
  static const std::regex re(R"(ckpt_failures[ =](\d+))");
  int64_t total = 0;
  size_t begin = 0;
  for (;;) {
    size_t end = output.find("\nrestart ", begin);
    const std::string attempt =
        output.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    total += MaxOverMatches(attempt, re,
                            [](const std::smatch& m) -> int64_t { return std::stoll(m[1]); });
    if (end == std::string::npos) return total;
    begin = end + 1;
  }
}

// Highest "step N" line printed so far.
int64_t LastStep(const std::string& output) {
  static const std::regex re(R"((^|\n)step (\d+) )");
  return MaxOverMatches(output, re,
                        [](const std::smatch& m) -> int64_t { return std::stoll(m[2]); });
}

absl::StatusOr<std::string> RunToEnd(const std::vector<std::string>& argv, const std::string& log,
                                     int* exit_code) {
  testing::ChildProcess c;
  RETURN_IF_ERROR(c.Start(argv, log));
  *exit_code = c.Wait();
  return c.Output();
}

}  // namespace

TrainingDrillConfig TrainingDrillFor(const DrillOptions& opts) {
  TrainingDrillConfig c{.server_bin = opts.server_bin, .train_bin = opts.train_bin,
                        .work_dir = opts.work_dir, .seed = opts.seed, .kills = opts.kills};
  // CI: short outages (0.5-0.8 s) and a job that outlasts them: one kill costs up to ~1.5 s
  // (uptime, outage, restart), 16 steps of >= 100 ms. A job shorter than the storm ended
  // before its last kills, and one the storm covered end to end never committed a FULL.
  if (opts.quick) {
    c.down_ms_min = 500;
    c.down_ms_max = 800;
    c.up_ms_min = 50;
    c.up_ms_max = 300;
    c.step_delay_ms = 100;
    c.steps = std::max<int64_t>(60, c.kills * 16);
  } else {
    c.steps = std::max<int64_t>(100, c.kills * 30);
  }
  c.fail_at_step = c.steps / 3;
  return c;
}

absl::Status RunTrainingDrill(const TrainingDrillConfig& c,
                              std::map<std::string, std::string>* kv) {
  std::error_code ec;
  std::filesystem::remove_all(c.work_dir + "/train", ec);
  std::filesystem::create_directories(c.work_dir + "/train", ec);
  const std::string dir = c.work_dir + "/train";

  int ref_exit = -1;
  ASSIGN_OR_RETURN(std::string ref, RunToEnd(TrainArgs(c, "", 0, "none"), dir + "/ref.log",
                                             &ref_exit));
  const std::string want_sha = SummaryField(ref, "params_sha256");
  if (ref_exit != 0 || want_sha.empty()) {
    return absl::InternalError("the uninterrupted reference run failed: " + ref);
  }

  // A fixed port: the restarts after each kill come back on the job's --storage address.
  testing::ServerProcess server(c.server_bin);
  ASSIGN_OR_RETURN(const int port, testing::FreePort());
  RETURN_IF_ERROR(server.StartOn(dir + "/server", absl::StrCat("127.0.0.1:", port)));
  testing::ChildProcess job;
  const std::string log = dir + "/job.log";
  RETURN_IF_ERROR(
      job.Start(TrainArgs(c, server.address(), c.step_delay_ms, "none", c.fail_at_step), log));
  // Kill only once the job trains (its start-up, resume check and epoch need the server).
  while (job.Poll() < 0 && LastStep(job.Output()) < 3) SleepMs(20);

  std::mt19937_64 rng(c.seed);
  auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng);
  };
  int kills = 0;
  while (kills < c.kills && job.Poll() < 0) {
    SleepMs(uniform(c.up_ms_min, c.up_ms_max));
    server.Kill();
    ++kills;
    SleepMs(uniform(c.down_ms_min, c.down_ms_max));
    RETURN_IF_ERROR(server.Restart());
  }
  const int train_exit = job.Wait();
  const std::string out = job.Output();

  // What the store lists after the storm.
  client::ClientOptions co;
  co.endpoints = {server.address()};
  ASSIGN_OR_RETURN(std::unique_ptr<client::Client> cl, client::Client::Connect(co));
  const std::set<int64_t> recovery_points = RecoveryPoints(out);
  ASSIGN_OR_RETURN(StoreReport rep, CheckStore(*cl, kJob, recovery_points));
  cl.reset();

  // --resume latest right after, the server up: finishes with the uninterrupted parameters.
  int resume_exit = -1;
  ASSIGN_OR_RETURN(std::string resumed,
                   RunToEnd(TrainArgs(c, server.address(), 0, "latest"), dir + "/resume.log",
                            &resume_exit));
  const std::string resumed_from = SummaryField(resumed, "resumed_from");
  const int64_t from = resumed_from.empty() ? -1 : std::stoll(resumed_from);

  (*kv)["server_kills"] = absl::StrCat(kills);
  (*kv)["train_exit"] = absl::StrCat(train_exit);
  const int restarts = testing::CountLines(out, "restart ");
  // Each restart's cause, as the launcher printed it, after the job's last lines before it
  // (a rank's error): a failed run says why it restarted.
  {
    std::istringstream lines(out);
    std::vector<std::string> recent;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("restart ", 0) == 0) {
        for (const std::string& r : recent) std::fprintf(stderr, "drill:   %s\n", r.c_str());
        std::fprintf(stderr, "drill: job %s\n", line.c_str());
        recent.clear();
        continue;
      }
      recent.push_back(line);
      if (recent.size() > 6) recent.erase(recent.begin());
    }
  }
  // The drill's own rank kill; the attempt after it resumes from the recovery point of that
  // moment (its "resumed job" line), or from scratch when none had committed yet.
  const size_t kill_at = out.find("restart 1 of 3: rank 1 killed by signal 9");
  const bool drill_restart = c.fail_at_step > 0 && kill_at != std::string::npos;
  int64_t resumed_step = 0;
  static const std::regex resumed_re(R"(resumed job \S+ from step (\d+))");
  std::smatch m;
  const std::string after = drill_restart ? out.substr(kill_at) : "";
  if (std::regex_search(after, m, resumed_re)) resumed_step = std::stoll(m[1]);
  (*kv)["train_restarts"] = absl::StrCat(restarts);
  (*kv)["train_restarts_caused_by_storage"] = absl::StrCat(restarts - (drill_restart ? 1 : 0));
  (*kv)["steps_lost_max"] =
      absl::StrCat(drill_restart ? c.fail_at_step - 1 - resumed_step : 0);
  (*kv)["ckpt_failures"] = SummaryField(out, "ckpt_failures").empty()
                              ? "-1"
                              : absl::StrCat(CkptFailuresAllAttempts(out));
  PutCounts({{"lost_data", rep.lost_data}, {"partial_listed", rep.partial_listed},
             {"orphan_deltas_listed", rep.orphan_deltas_listed},
             {"chain_holes_listed", rep.chain_holes_listed}, {"verify_errors", rep.verify_errors},
             {"pending_left", rep.pending_left},
             {"recovery_points_seen", static_cast<int64_t>(recovery_points.size())},
             {"recovery_points_lost", rep.recovery_points_lost}},
            kv);
  // Ranks that disagreed on a checkpoint's spec (e.g. a DELTA's base_step) would show up as
  // "exists with another spec" refusals.
  size_t spec_conflicts = 0;
  for (size_t at = out.find("another spec"); at != std::string::npos;
       at = out.find("another spec", at + 1)) {
    ++spec_conflicts;
  }
  (*kv)["spec_conflicts"] = absl::StrCat(spec_conflicts);
  (*kv)["listed_fulls"] = absl::StrCat(rep.fulls);
  (*kv)["listed_deltas"] = absl::StrCat(rep.deltas);
  (*kv)["params_match"] = SummaryField(out, "params_sha256") == want_sha ? "1" : "0";
  // The resume starts from the job's last recovery point, not earlier (nor afresh: an empty
  // store also ends with the right parameters, the run being deterministic), and, started at
  // the last step, prints the restored parameters' SHA-256: the bytes written, read back.
  const std::string last_rp = SummaryField(out, "recovery_point");
  const int64_t want_from = last_rp.empty() ? -2 : std::stoll(last_rp);
  (*kv)["resume_from_recovery_point"] = from >= 0 && from == want_from ? "1" : "0";
  (*kv)["resume_ok"] =
      resume_exit == 0 && SummaryField(resumed, "params_sha256") == want_sha ? "1" : "0";
  (*kv)["restored_params_match"] =
      from == c.steps && SummaryField(resumed, "params_sha256") == SummaryField(out, "params_sha256")
          ? "1"
          : "0";
  // Resume fallbacks past damaged records, as rank 0 prints them ("recovery point fell back
  // from step N to step S: ...", docs/gockpt.md).
  (*kv)["fallbacks"] = absl::StrCat(testing::CountLines(resumed, "recovery point fell back") +
                                    testing::CountLines(out, "recovery point fell back"));
  (*kv)["recovery_lag_max"] = absl::StrCat(MaxRecoveryLag(out));
  (*kv)["steps_lost_resume"] = absl::StrCat(from >= 0 ? c.steps - from : c.steps);
  return absl::OkStatus();
}

absl::Status RunTrainingScenario(const DrillOptions& opts,
                                 std::map<std::string, std::string>* kv) {
  return RunTrainingDrill(TrainingDrillFor(opts), kv);
}

}  // namespace drill
}  // namespace gradsnap
