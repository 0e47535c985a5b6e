#include "benchmarks/fault_drill/stall_scenario.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "benchmarks/common/bench_util.h"
#include "common/status.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace drill {
namespace {

using ::gradsnap::testing::ParseStepLines;
using ::gradsnap::testing::StepsBetween;
using ::gradsnap::testing::StepWindow;
using ::gradsnap::testing::SleepMs;
using ::gradsnap::testing::SummaryField;

constexpr int64_t kWarmupSteps = 20;  // the start-up's slow steps stay out of "before"
// The steps right after the fault (the backlog drains) stay out of the "after" control window.
constexpr int64_t kSettleSteps = 20;
constexpr uint64_t kLeaveFreeBytes = 4 << 20;  // below the server's 16 MiB catalog reserve

std::vector<std::string> JobArgs(const StallDrillConfig& c, const std::string& storage) {
  std::vector<std::string> a = {c.train_bin, "--model=tiny", absl::StrCat("--steps=", c.steps),
                                "--nproc=2", "--batch=4", "--seq=16", "--blas_threads=1"};
  if (storage.empty()) return a;  // the uninterrupted reference: no checkpointing
  a.insert(a.end(), {"--storage=" + storage, "--job=stall", "--ckpt_mode=gockpt",
                     absl::StrCat("--ckpt_every=", c.ckpt_every), "--grad_log",
                     "--max_restarts=0",
                     absl::StrCat("--ckpt_persist_timeout_ms=", c.persist_timeout_ms),
                     absl::StrCat("--test_step_delay_ms=", c.step_delay_ms)});
  return a;
}

int64_t LastStep(const testing::ChildProcess& job) { return testing::LastStepLine(job).step; }

// Polls until the job printed `step` or ended; false when it ended first.
bool WaitForStep(testing::ChildProcess& job, int64_t step) {
  while (LastStep(job) < step) {
    if (job.Poll() >= 0) return false;
    SleepMs(10);
  }
  return true;
}

}  // namespace

const char* StallFaultName(StallFault f) {
  return f == StallFault::kFullDisk ? "stall_full_disk" : "stall_outage";
}

StallDrillConfig StallDrillFor(const DrillOptions& opts, StallFault fault) {
  StallDrillConfig c{.server_bin = opts.server_bin, .train_bin = opts.train_bin,
                     .work_dir = opts.work_dir, .fault = fault, .seed = opts.seed};
  // Long enough after the fault for the back-off (at most persist_timeout_ms) to let a FULL
  // through again.
  c.persist_timeout_ms = 1000;
  // 150 steps before the fault: these few-ms steps vary by 10-40 % between blocks of 10 with no
  // fault at all, so 50 (the old window) left the ratio to chance (0.82-1.18 run to run).
  c.fault_from_step = opts.quick ? 60 : 170;
  c.fault_to_step = c.fault_from_step + (opts.fault_steps > 0 ? opts.fault_steps
                                         : opts.quick          ? 120
                                                               : 200);
  c.steps = c.fault_to_step + 150;
  c.ckpt_every = fault == StallFault::kFullDisk ? 2 : 5;
  // The outage: a job that lasts through a few dozen kills (each restart takes its time). The
  // full disk: the 150 steps after it must outlast the longest back-off (persist_timeout_ms)
  // and a FULL's persist, which the CPU trainer's own speed no longer guarantees (150 tiny
  // steps ran in under 1 s and no checkpoint committed after the fault: recovered=0).
  c.step_delay_ms = fault == StallFault::kOutage ? 50 : 20;
  c.server_idle = opts.stall_server_idle;
  c.server_flags = opts.stall_server_flags;
  return c;
}

absl::Status RunStallDrill(const StallDrillConfig& c, std::map<std::string, std::string>* kv) {
  const std::string name = StallFaultName(c.fault);
  const std::string dir = c.work_dir + "/" + name;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);

  const testing::RunResult ref = testing::RunCommand(
      absl::StrJoin(JobArgs(c, ""), " ") + " 2>&1", /*timeout_s=*/600);
  const std::string want_sha = SummaryField(ref.out, "params_sha256");
  if (ref.exit_code != 0 || want_sha.empty()) {
    return absl::InternalError("the uninterrupted reference run failed: " + ref.out);
  }

  std::unique_ptr<testing::Tmpfs> fs;
  std::string data = dir + "/data";
  if (c.fault == StallFault::kFullDisk) {
    fs = std::make_unique<testing::Tmpfs>(dir + "/fs", c.tmpfs_mib);
    if (!fs->mounted()) {
      return absl::FailedPreconditionError(
          "stall_full_disk: cannot mount a tmpfs for the server (needs CAP_SYS_ADMIN)");
    }
    data = dir + "/fs/data";
  }
  const std::string ballast = dir + "/fs/ballast";
  testing::ServerProcess server(c.server_bin);
  // chrt execs the server, so pid() (killed, CPU-sampled) stays the server's; each restart runs
  // under it too.
  if (c.server_idle) server.set_wrap({"chrt", "--idle", "0"});
  ASSIGN_OR_RETURN(const int port, testing::FreePort());
  RETURN_IF_ERROR(server.StartOn(data, absl::StrCat("127.0.0.1:", port), c.server_flags));
  testing::ChildProcess job;
  RETURN_IF_ERROR(job.Start(JobArgs(c, server.address()), dir + "/job.log"));
  const auto job_start = std::chrono::steady_clock::now();
  double server_cpu_share_before = 0;

  int kills = 0;
  int64_t first = -1, last = -1;  // the steps during the fault
  int64_t before_last = -1;       // the last step before it
  // CPU seconds the server processes used while the fault lasted, over its wall time: on this
  // one host the server shares the cores with the ranks (a storage node would not).
  double server_cpu_s = 0, fault_s = 0;
  if (WaitForStep(job, c.fault_from_step)) {
    before_last = LastStep(job);
    first = before_last + 1;
    const double cpu_at_start = std::max(0.0, bench::CpuSecondsOf(server.pid()));
    const auto fault_start = std::chrono::steady_clock::now();
    const double before_s = std::chrono::duration<double>(fault_start - job_start).count();
    server_cpu_share_before = before_s > 0 ? cpu_at_start / before_s : 0;
    if (c.fault == StallFault::kFullDisk) {
      testing::FillUpLeaving(ballast, kLeaveFreeBytes);
      first = LastStep(job) + 1;  // the disk is full from here (the steps of the fill: neither)
      WaitForStep(job, c.fault_to_step);
      server_cpu_s = std::max(0.0, bench::CpuSecondsOf(server.pid()) - cpu_at_start);
      std::filesystem::remove(ballast, ec);
    } else {
      std::mt19937_64 rng(c.seed);
      server_cpu_s = -cpu_at_start;
      while (LastStep(job) < c.fault_to_step && job.Poll() < 0) {
        server_cpu_s += std::max(0.0, bench::CpuSecondsOf(server.pid()));
        server.Kill();
        ++kills;
        RETURN_IF_ERROR(server.Restart());
        SleepMs(std::uniform_int_distribution<int>(c.up_ms_min, c.up_ms_max)(rng));
      }
      server_cpu_s += std::max(0.0, bench::CpuSecondsOf(server.pid()));  // the last instance's
    }
    last = LastStep(job);
    fault_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - fault_start).count();
  }
  const int train_exit = job.Wait();
  const std::string out = job.Output();
  if (first < 0) return absl::InternalError("the job ended before the fault: " + out);

  const std::vector<testing::StepLine> lines = ParseStepLines(out);
  const StepWindow before = StepsBetween(lines, kWarmupSteps, before_last);
  const StepWindow during = StepsBetween(lines, first, last);
  const StepWindow after = StepsBetween(lines, last + kSettleSteps, c.steps);
  const std::string rp = SummaryField(out, "recovery_point");
  const std::string p = name + "_";
  (*kv)[p + "throughput_ratio"] =
      absl::StrFormat("%.3f", during.mean_step_ms > 0 ? before.mean_step_ms / during.mean_step_ms
                                                      : 0.0);
  (*kv)[p + "after_ratio"] =
      absl::StrFormat("%.3f", after.mean_step_ms > 0 ? before.mean_step_ms / after.mean_step_ms
                                                     : 0.0);
  (*kv)[p + "max_stall_s"] = absl::StrFormat("%.3f", during.max_stall_ms / 1000);
  (*kv)[p + "stall_s_before"] = absl::StrFormat("%.3f", before.max_stall_ms / 1000);
  (*kv)[p + "fault_steps"] = absl::StrCat(during.steps);
  (*kv)[p + "server_cpu_share"] =
      absl::StrFormat("%.3f", fault_s > 0 ? std::max(0.0, server_cpu_s) / fault_s : 0.0);
  (*kv)[p + "server_cpu_share_before"] = absl::StrFormat("%.3f", server_cpu_share_before);
  (*kv)[p + "server_sched"] = c.server_idle ? "idle" : "normal";
  if (!c.server_flags.empty()) (*kv)[p + "server_flags"] = absl::StrJoin(c.server_flags, " ");
  (*kv)[p + "train_exit"] = absl::StrCat(train_exit);
  (*kv)[p + "params_match"] = absl::StrCat(SummaryField(out, "params_sha256") == want_sha ? 1 : 0);
  (*kv)[p + "ckpt_failures"] = SummaryField(out, "ckpt_failures");
  (*kv)[p + "ckpt_skipped"] = SummaryField(out, "ckpt_skipped");
  (*kv)[p + "recovered"] = absl::StrCat(!rp.empty() && std::stoll(rp) > last ? 1 : 0);
  if (c.fault == StallFault::kOutage) (*kv)[p + "server_kills"] = absl::StrCat(kills);
  return absl::OkStatus();
}

absl::Status RunStallDrillRepeated(StallDrillConfig c, int runs,
                                   std::map<std::string, std::string>* kv) {
  if (runs < 1) return absl::InvalidArgumentError("runs must be >= 1");
  const std::string p = std::string(StallFaultName(c.fault)) + "_";
  const std::string root = c.work_dir;
  const uint64_t seed = c.seed;
  std::vector<std::map<std::string, std::string>> all;
  for (int i = 0; i < runs; ++i) {
    c.seed = seed + static_cast<uint64_t>(i);
    c.work_dir = absl::StrCat(root, "/run", i);
    std::error_code ec;
    std::filesystem::create_directories(c.work_dir, ec);
    std::map<std::string, std::string> one;
    const absl::Status s = RunStallDrill(c, &one);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("run ", i + 1, ": ", s.message()));
    all.push_back(std::move(one));
  }
  auto nums = [&](const std::string& key) {
    std::vector<double> v;
    for (const auto& one : all) {
      auto it = one.find(p + key);
      v.push_back(it == one.end() || it->second.empty() ? -1.0 : std::stod(it->second));
    }
    return v;
  };
  *kv = all.front();  // server_sched, server_flags: the same in every run
  for (const std::string key : {"throughput_ratio", "after_ratio"}) {
    const std::vector<double> v = nums(key);
    (*kv)[p + key] = absl::StrFormat("%.3f", bench::Median(v));
    (*kv)[p + key + "_runs"] = absl::StrJoin(v, ",", [](std::string* out, double x) {
      absl::StrAppendFormat(out, "%.3f", x);
    });
  }
  for (const std::string key : {"max_stall_s", "stall_s_before"}) {
    const std::vector<double> v = nums(key);
    (*kv)[p + key] = absl::StrFormat("%.3f", *std::max_element(v.begin(), v.end()));
  }
  for (const std::string key : {"server_cpu_share", "server_cpu_share_before"}) {
    const std::vector<double> v = nums(key);
    (*kv)[p + key] =
        absl::StrFormat("%.3f", std::accumulate(v.begin(), v.end(), 0.0) / v.size());
  }
  // What each run must show holds for all of them: the worst run's value. A full disk fails
  // persists in every run; a server restarted within the client's quick retries may fail none
  // in one run, so the outage's failures are summed (its kills are the fault there).
  std::vector<std::string> worst = {"params_match", "recovered", "fault_steps"};
  std::vector<std::string> summed = {"ckpt_skipped", "server_kills"};
  (c.fault == StallFault::kFullDisk ? worst : summed).push_back("ckpt_failures");
  for (const std::string& key : worst) {
    const std::vector<double> v = nums(key);
    (*kv)[p + key] = absl::StrCat(static_cast<int64_t>(*std::min_element(v.begin(), v.end())));
  }
  for (const auto& one : all) {
    if (one.at(p + "train_exit") != "0") (*kv)[p + "train_exit"] = one.at(p + "train_exit");
  }
  for (const std::string& key : summed) {
    if (kv->count(p + key) == 0) continue;
    const std::vector<double> v = nums(key);
    (*kv)[p + key] = absl::StrCat(static_cast<int64_t>(std::accumulate(v.begin(), v.end(), 0.0)));
  }
  (*kv)[p + "runs"] = absl::StrCat(runs);
  return absl::OkStatus();
}

bool StallTargetsMet(StallFault fault, const std::map<std::string, std::string>& kv,
                     std::string* why) {
  const std::string p = std::string(StallFaultName(fault)) + "_";
  bool met = true;
  auto check = [&](const std::string& key, bool ok) {
    if (ok) return;
    met = false;
    auto it = kv.find(key);
    absl::StrAppend(why, " ", key, "=", it == kv.end() ? "?" : it->second);
  };
  auto num = [&](const std::string& key) {
    auto it = kv.find(key);
    return it == kv.end() || it->second.empty() ? -1.0 : std::stod(it->second);
  };
  check(p + "throughput_ratio", num(p + "throughput_ratio") >= 0.90);
  check(p + "max_stall_s", num(p + "max_stall_s") >= 0 && num(p + "max_stall_s") <= 0.5);
  check(p + "train_exit", num(p + "train_exit") == 0);
  check(p + "params_match", num(p + "params_match") == 1);
  check(p + "ckpt_failures", num(p + "ckpt_failures") > 0);
  check(p + "recovered", num(p + "recovered") == 1);
  return met;
}

}  // namespace drill
}  // namespace gradsnap
