// snapshot_bench: runs gradsnap-train on the same model and data in each checkpoint mode
// (none, sync, async, gockpt, gockpt without -O, gockpt + gradient log), a FULL checkpoint every
// N steps, in interleaved rounds, on --device cpu, sim (the simulated asynchronous GPU with its
// throttled copy engine, --sim_copy_gbps) or cuda, and prints the ratios of DESIGN.md section 7:
//   throughput_ratio_gockpt          tokens/s of gockpt / none (best round of each mode: on a
//                                    shared machine outside load only ever slows a run down,
//                                    so the best round is the least disturbed; medians are
//                                    printed too)
//   throughput_ratio_gockpt_gradlog  tokens/s of gockpt + --grad_log / none
//   stall_ratio_gockpt_vs_sync       checkpoint stall per FULL, gockpt / sync (FULLs completed
//                                    during training; see below)
//   stall_ratio_async_vs_sync        the same for async
//   stall_ratio_gockpt_vs_async      checkpoint stall per FULL, gockpt / async
//   window_k                         the K gockpt chose (automatic unless --window)
//   overlap_o_gain                   stall per FULL of gockpt without -O / with -O (stalls
//                                    under 0.1 ms count as 0.1 ms)
//   delta_bytes_ratio                stored bytes per DELTA / per FULL (gradient log run)
//   host_mem_ratio                   pinned host bytes of checkpointing / one copy of the state
//                                    (gockpt; host_mem_ratio_gradlog for gockpt + log)
//   grad_copy_ratio[_gradlog]        gradient bytes copied off the device per update / one
//                                    gradient (gockpt; gockpt + log, where it is 1: the log's
//                                    copy is the replay's too)
//   copy_engine_utilization[_gradlog] the largest per-step copy time asked of the copy engine /
//                                    the step time (gockpt; gockpt + log; median over rounds);
//                                    above 1 the engine was asked for more than a step's worth
//   window_fits[_gradlog]            1 when the automatic K fitted the copy traffic (ChooseWindow)
//   cpu_ratio_gockpt[_gradlog]       CPU seconds of the none run / of the mode's run (medians):
//                                    the throughput ratio a machine with no spare core would
//                                    see, and a figure outside load does not disturb much
// Stall is the time the training loop spends inside the checkpointing hooks during steps
// (the per-step stall_ms). Stall per FULL divides it by the FULL checkpoints completed during
// training: the FULLs started less the windows the run's end cut short (the summary's
// cut_short; their rest is copied, or with the log abandoned, in the engine's Finish after the
// last step). The *_with_finish ratios count every FULL started instead, the cut-short ones
// with the stall of the engine's Finish at the run's end (the summary's finish_ms; the
// backlog's final drain excluded): a window cut short by the end copies its rest blocking,
// which costs what a sync FULL costs. A run without step lines or a tokens_per_s summary, or a sync or
// async stall of zero (nothing to compare with), fails the bench (exit 1): a ratio is never
// printed from a run that was not measured. Usage: snapshot_bench [--model small --steps 30 --every 10 ...]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmarks/common/bench_util.h"
#include "client/client.h"
#include "common/command_line.h"
#include "gpu_snapshot/device_flags.h"
#include "gpu_snapshot/snapshot_mode.h"

ABSL_FLAG(std::string, model, "small", "gradsnap-train model. Default: small (~10.8M parameters)");
ABSL_FLAG(int, steps, 30, "Training steps per run. Default: 30");
ABSL_FLAG(int, every, 10, "FULL checkpoint every N steps. Default: 10");
ABSL_FLAG(int, batch, 4, "Global batch. Default: 4");
ABSL_FLAG(int, seq, 64, "Sequence length. Default: 64");
ABSL_FLAG(int, rounds, 2, "Rounds; each runs every mode once, interleaved. Default: 2");
ABSL_FLAG(int, window, 0, "--gockpt_window for the gockpt runs; 0 = automatic. Default: 0");
// --device, --device_id and --sim_copy_gbps (gpu_snapshot/device_flags.h) are passed on to
// gradsnap-train.
ABSL_FLAG(std::string, train, "", "gradsnap-train binary. Default: next to this binary");
ABSL_FLAG(std::string, dir, "", "Scratch directory (removed after). Default: a fresh temp dir");

namespace {

namespace fs = std::filesystem;
using gradsnap::gpu_snapshot::SnapshotMode;

// A run: its label, the --ckpt_mode it trains with and its other flags.
struct Mode {
  std::string name;
  SnapshotMode mode;
  std::vector<std::string> flags;
};

struct RunStats {
  bool ok = false;
  double tokens_per_s = 0;
  double stall_ms = 0;   // sum of per-step stall_ms
  double finish_ms = 0;  // the engine's Finish (summary)
  int cut_short = 0;     // windows the run's end cut short (summary)
  int steps = 0;         // step lines parsed
  int fulls = 0;         // FULL checkpoints started
  double host_mem_ratio = 0;
  double cpu_s = 0;      // user + system CPU seconds of the whole run (all threads)
  int window = 0;        // K of the first FULL checkpoint (gockpt)
  double grad_copy_ratio = 0;   // summary: gradient bytes copied per update / one gradient
  double copy_util = 0;         // summary: copy_engine_utilization
  int window_fits = 1;          // summary: window_fits
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

RunStats Parse(const std::string& out, SnapshotMode mode) {
  RunStats r;
  std::regex step_re(R"(^step \d+ loss \S+ step_ms \S+ stall_ms (\S+))");
  std::regex tps_re(R"(tokens_per_s=(\S+))");
  std::regex start_re(R"(^ckpt step \d+ \S+ start window=(\d+))");
  std::regex mem_re(R"(host_mem_ratio=(\S+))");
  std::regex finish_re(R"(^ckpt summary .* finish_ms=(\S+))");
  std::regex gcr_re(R"(^ckpt summary .* grad_copy_ratio=(\S+))");
  std::regex util_re(R"(^ckpt summary .* copy_engine_utilization=(\S+))");
  std::regex fits_re(R"(^ckpt summary .* window_fits=(\d+))");
  std::regex cut_re(R"(^ckpt summary .* cut_short=(\d+))");
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, step_re)) {
      r.stall_ms += std::stod(m[1]);
      ++r.steps;
    }
    if (std::regex_search(line, m, finish_re)) r.finish_ms = std::stod(m[1]);
    if (std::regex_search(line, m, cut_re)) r.cut_short = std::stoi(m[1]);
    if (std::regex_search(line, m, gcr_re)) r.grad_copy_ratio = std::stod(m[1]);
    if (std::regex_search(line, m, util_re)) r.copy_util = std::stod(m[1]);
    if (std::regex_search(line, m, fits_re)) r.window_fits = std::stoi(m[1]);
    if (std::regex_search(line, m, tps_re)) {
      r.tokens_per_s = std::stod(m[1]);
      r.ok = true;
    }
    if (std::regex_search(line, m, start_re)) {
      if (r.fulls++ == 0) r.window = std::stoi(m[1]);
    }
    if (std::regex_search(line, m, mem_re)) r.host_mem_ratio = std::stod(m[1]);
  }
  if (mode == SnapshotMode::kSync) r.fulls = absl::GetFlag(FLAGS_steps) / absl::GetFlag(FLAGS_every);
  return r;
}

RunStats RunMode(const std::string& train, const Mode& mode, const std::string& dir,
                 int round) {
  std::string ckpt = absl::StrCat(dir, "/", mode.name, "_", round);
  std::vector<std::string> args = {
      train, absl::StrCat("--model=", absl::GetFlag(FLAGS_model)),
      absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)),
      absl::StrCat("--batch=", absl::GetFlag(FLAGS_batch)),
      absl::StrCat("--seq=", absl::GetFlag(FLAGS_seq)), absl::StrCat("--ckpt_dir=", ckpt),
      "--job=bench"};
  const std::vector<std::string> device = gradsnap::gpu_snapshot::DeviceFlagArgs();
  args.insert(args.end(), device.begin(), device.end());
  args.push_back(absl::StrCat("--ckpt_mode=", gradsnap::gpu_snapshot::SnapshotModeName(mode.mode)));
  args.insert(args.end(), mode.flags.begin(), mode.flags.end());
  std::string out = absl::StrCat(dir, "/", mode.name, "_", round, ".out");
  std::string cmd = absl::StrCat(absl::StrJoin(args, " "), " >", out, " 2>&1");
  auto cpu = [] {
    rusage u;
    getrusage(RUSAGE_CHILDREN, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  const double cpu0 = cpu();
  int st = std::system(cmd.c_str());
  std::string text = Slurp(out);
  RunStats r = Parse(text, mode.mode);
  r.cpu_s = cpu() - cpu0;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !r.ok || r.steps == 0) {
    r.ok = false;
    r.err = text.substr(text.size() > 2000 ? text.size() - 2000 : 0);
  }
  return r;
}

// Stored bytes per DELTA and per FULL checkpoint in the gradient-log run's store.
bool StoredBytes(const std::string& ckpt_dir, double* per_delta, double* per_full) {
  gradsnap::client::ClientOptions o;
  o.local_dir = ckpt_dir;
  auto c = gradsnap::client::Client::Connect(o);
  if (!c.ok()) return false;
  auto list = (*c)->List("bench");
  if (!list.ok()) return false;
  double d = 0, f = 0;
  int nd = 0, nf = 0;
  for (const auto& info : *list) {
    if (info.kind == gradsnap::client::CheckpointKind::kDelta) {
      d += static_cast<double>(info.stored_bytes);
      ++nd;
    } else {
      f += static_cast<double>(info.stored_bytes);
      ++nf;
    }
  }
  if (nd == 0 || nf == 0) return false;
  *per_delta = d / nd;
  *per_full = f / nf;
  return true;
}

using gradsnap::bench::Median;

// Bad input: one line on stderr, exit status 2.
int BadInput(const std::string& msg) {
  std::fprintf(stderr, "snapshot_bench: %s\n", msg.c_str());
  return 2;
}

// --device and its options, checked before any run (one rank).
int ValidateDevice() {
  const absl::Status s = gradsnap::gpu_snapshot::CheckDeviceFlags(1);
  return s.ok() ? 0 : BadInput(std::string(s.message()));
}

}  // namespace

int main(int argc, char** argv) {
  // --sim-copy-gbps is --sim_copy_gbps (gradsnap-train accepts both spellings too).
  gradsnap::CommandLine(
      argc, argv,
      "snapshot_bench [--device cpu|sim|cuda] [--model small] [--steps 30] [--every 10] "
      "[--rounds 2]: the checkpoint modes of gradsnap-train side by side; last line name=value "
      "ratios",
      {"snapshot_bench", "device_flags"})
      .Parse();
  if (int rc = ValidateDevice(); rc != 0) return rc;
  std::string train = absl::GetFlag(FLAGS_train);
  if (train.empty()) {
    train = (fs::path(fs::read_symlink("/proc/self/exe")).parent_path() / "gradsnap-train")
                .string();
  }
  if (!fs::exists(train)) {
    std::fprintf(stderr, "snapshot_bench: no gradsnap-train at %s (--train)\n", train.c_str());
    return 1;
  }
  const int every = absl::GetFlag(FLAGS_every);
  if (every < 1 || absl::GetFlag(FLAGS_steps) < every || absl::GetFlag(FLAGS_rounds) < 1) {
    std::fprintf(stderr, "snapshot_bench: need --every >= 1, --steps >= --every, --rounds >= 1\n");
    return 1;
  }
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) dir = (fs::temp_directory_path() / absl::StrCat("snapbench_", getpid())).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string ev = absl::StrCat("--ckpt_every=", every);
  std::string win = absl::StrCat("--gockpt_window=", absl::GetFlag(FLAGS_window));
  const std::vector<Mode> modes = {
      {"none", SnapshotMode::kNone, {}},
      {"sync", SnapshotMode::kSync, {ev}},
      {"async", SnapshotMode::kAsync, {ev}},
      {"gockpt", SnapshotMode::kGoCkpt, {ev, win}},
      {"gockpt_noO", SnapshotMode::kGoCkpt, {ev, win, "--gockpt_overlap=false"}},
      {"gockpt_gradlog", SnapshotMode::kGoCkpt, {ev, win, "--grad_log"}},
  };
  std::map<std::string, std::vector<RunStats>> runs;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (const Mode& m : modes) {
      RunStats r = RunMode(train, m, dir, round);
      if (!r.ok) {
        std::fprintf(stderr, "snapshot_bench: mode %s failed:\n%s\n", m.name.c_str(),
                     r.err.c_str());
        return 1;
      }
      std::printf(
          "round %d %-15s tokens_per_s %8.1f stall_ms %8.1f finish_ms %7.1f fulls %d "
          "cut_short %d host_mem_ratio %.3f cpu_s %.1f\n",
          round, m.name.c_str(), r.tokens_per_s, r.stall_ms, r.finish_ms, r.fulls, r.cut_short,
          r.host_mem_ratio, r.cpu_s);
      std::fflush(stdout);
      runs[m.name].push_back(r);
    }
  }
  auto tps = [&](const std::string& m) {
    std::vector<double> v;
    for (auto& r : runs[m]) v.push_back(r.tokens_per_s);
    return Median(v);
  };
  auto best_tps = [&](const std::string& m) {
    double best = 0;
    for (auto& r : runs[m]) best = std::max(best, r.tokens_per_s);
    return best;
  };
  // FULLs completed during training (see the top); with_finish: every FULL started, with the
  // engine's Finish.
  auto stall_per_full = [&](const std::string& m, bool with_finish = false) {
    std::vector<double> v;
    for (auto& r : runs[m]) {
      const int fulls = with_finish ? r.fulls : r.fulls - r.cut_short;
      const double stall = with_finish ? r.stall_ms + r.finish_ms : r.stall_ms;
      v.push_back(fulls > 0 ? stall / fulls : 0);
    }
    return Median(v);
  };
  auto median_of = [&](const std::string& m, double RunStats::*field) {
    std::vector<double> v;
    for (auto& r : runs[m]) v.push_back(r.*field);
    return Median(v);
  };
  auto cpu = [&](const std::string& m) {
    std::vector<double> v;
    for (auto& r : runs[m]) v.push_back(r.cpu_s);
    return Median(v);
  };
  double per_delta = 0, per_full = 0;
  bool have_bytes = StoredBytes(absl::StrCat(dir, "/gockpt_gradlog_0"), &per_delta, &per_full);
  std::printf("model=%s steps=%d every=%d rounds=%d\n", absl::GetFlag(FLAGS_model).c_str(),
              absl::GetFlag(FLAGS_steps), every, absl::GetFlag(FLAGS_rounds));
  for (const Mode& m : modes) {
    std::printf(
        "%-15s tokens_per_s median %8.1f best %8.1f  stall_ms per FULL (median) %8.1f "
        "(with Finish %8.1f)  cpu_s (median) %6.1f\n",
        m.name.c_str(), tps(m.name), best_tps(m.name), stall_per_full(m.name),
        stall_per_full(m.name, true), cpu(m.name));
  }
  if (have_bytes) {
    std::printf("stored bytes per DELTA %.0f per FULL %.0f\n", per_delta, per_full);
  }
  const double sync_stall = stall_per_full("sync");
  const double async_stall = stall_per_full("async");
  if (sync_stall <= 0 || async_stall <= 0) {
    std::fprintf(stderr,
                 "snapshot_bench: a stall of zero per FULL (sync %.3f ms, async %.3f ms): "
                 "nothing to compare with; no ratio printed\n",
                 sync_stall, async_stall);
    fs::remove_all(dir);
    return 1;
  }
  const double o_stall = std::max(0.1, stall_per_full("gockpt"));
  std::printf(
      "device=%s throughput_ratio_gockpt=%.4f throughput_ratio_gockpt_gradlog=%.4f "
      "stall_ratio_gockpt_vs_sync=%.4f stall_ratio_gockpt_vs_async=%.4f "
      "stall_ratio_async_vs_sync=%.4f window_k=%d overlap_o_gain=%.2f delta_bytes_ratio=%.4f "
      "host_mem_ratio=%.4f host_mem_ratio_gradlog=%.4f cpu_ratio_gockpt=%.4f "
      "cpu_ratio_gockpt_gradlog=%.4f grad_copy_ratio=%.4f grad_copy_ratio_gradlog=%.4f "
      "copy_engine_utilization=%.3f copy_engine_utilization_gradlog=%.3f window_fits=%d "
      "window_fits_gradlog=%d stall_ratio_gockpt_vs_sync_with_finish=%.4f "
      "stall_ratio_gockpt_vs_async_with_finish=%.4f\n",
      absl::GetFlag(FLAGS_device).c_str(), best_tps("gockpt") / best_tps("none"),
      best_tps("gockpt_gradlog") / best_tps("none"),
      stall_per_full("gockpt") / sync_stall, stall_per_full("gockpt") / async_stall,
      async_stall / sync_stall, runs["gockpt"][0].window,
      std::max(0.1, stall_per_full("gockpt_noO")) / o_stall,
      have_bytes ? per_delta / per_full : 0, runs["gockpt"][0].host_mem_ratio,
      runs["gockpt_gradlog"][0].host_mem_ratio, cpu("none") / cpu("gockpt"),
      cpu("none") / cpu("gockpt_gradlog"), median_of("gockpt", &RunStats::grad_copy_ratio),
      median_of("gockpt_gradlog", &RunStats::grad_copy_ratio),
      median_of("gockpt", &RunStats::copy_util),
      median_of("gockpt_gradlog", &RunStats::copy_util), runs["gockpt"][0].window_fits,
      runs["gockpt_gradlog"][0].window_fits,
      stall_per_full("gockpt", true) / stall_per_full("sync", true),
      stall_per_full("gockpt", true) / stall_per_full("async", true));
  fs::remove_all(dir);
  return 0;
}
