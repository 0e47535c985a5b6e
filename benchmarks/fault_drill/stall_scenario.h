// The stall scenarios of the fault drill: storage trouble must cost training nothing but the age
// of its recovery point. A 2-rank gockpt + gradient-log job of gradsnap-train (tiny model)
// trains against a gradsnap-server; once the job printed step `fault_from_step` the drill
// starts a fault, and ends it once the job printed `fault_to_step`:
//   stall_full_disk  the server's data directory (a tmpfs of its own) is filled with a
//                    ballast file until less than the server's catalog reserve is free, so
//                    every upload is refused RESOURCE_EXHAUSTED; the ballast is deleted at the
//                    end of the fault;
//   stall_outage     the server is SIGKILLed and restarted on its port over and over, up for
//                    `up_ms_min`..`up_ms_max` between kills.
// Measured from rank 0's step lines (step_ms excludes --test_step_delay_ms): the steps before
// the fault (from step 20, past the start-up; 150 of them, as these few-ms steps are noisy)
// against the steps while it lasts.
//
// Keys (RunStallDrill), each prefixed by the scenario's name and '_': throughput_ratio
// (tokens/s while the fault lasts / before it, i.e. mean step_ms before / during; target
// >= 0.90), after_ratio (the same for the steps from 20 after the fault to the end, against
// before: with no fault in either, its distance from 1 is the measure's own noise), max_stall_s (the largest stall_ms of a step during the fault, in s; target <= 0.5),
// stall_s_before (the same before the fault), train_exit (target 0), params_match (1: the
// job's params_sha256 equals an uninterrupted run's), ckpt_failures (> 0: the fault was seen),
// ckpt_skipped, fault_steps (steps during the fault), recovered (1: a checkpoint after the
// fault committed: the job's final recovery point is past fault_to_step), server_kills
// (stall_outage), server_cpu_share (CPU seconds of the server processes during the fault / its
// wall seconds: on one host the server shares the ranks' cores, as a storage node would not),
// server_cpu_share_before (the same from the job's start to the fault, start-up included),
// server_sched ("idle": the server ran under SCHED_IDLE, modelling a storage node on another
// machine; "normal": co-located at the ranks' priority, its restarts cost the ranks compute).
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_STALL_SCENARIO_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_STALL_SCENARIO_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "benchmarks/fault_drill/drill_util.h"

namespace gradsnap {
namespace drill {

enum class StallFault { kFullDisk, kOutage };
const char* StallFaultName(StallFault f);  // "stall_full_disk", "stall_outage"

struct StallDrillConfig {
  std::string server_bin, train_bin, work_dir;
  StallFault fault = StallFault::kFullDisk;
  uint64_t seed = 1;
  int64_t fault_from_step = 170;
  int64_t fault_to_step = 260;
  int64_t steps = 320;                // the job's steps (> fault_to_step)
  int64_t ckpt_every = 2;             // --ckpt_every
  int64_t step_delay_ms = 0;          // --test_step_delay_ms
  int64_t persist_timeout_ms = 5000;  // --ckpt_persist_timeout_ms (the default)
  int up_ms_min = 200, up_ms_max = 900;  // outage: the server's uptime between kills
  // full_disk: the server's file system, room for all the job's checkpoints (it keeps every
  // one, about 1.4 MB each) besides the ballast: at 256 MiB they filled it again after the
  // fault, so the steps after it ran on a full disk too.
  int tmpfs_mib = 1024;
  // The server (every restart too) under SCHED_IDLE: DrillOptions::stall_server_idle.
  bool server_idle = true;
  std::vector<std::string> server_flags = {};  // extra gradsnap-server flags (--stall_server_flags)
};
// The scenario's defaults: the jobs (a FULL every 2 steps on the full disk, every 5 in
// the outage), --ckpt_persist_timeout_ms 1000, the fault from step 170 (opts.quick: 60), 200
// steps of it (opts.quick: 120; opts.fault_steps where set) and 150 after it.
StallDrillConfig StallDrillFor(const DrillOptions& opts, StallFault fault);

absl::Status RunStallDrill(const StallDrillConfig& config, std::map<std::string, std::string>* kv);

// RunStallDrill `runs` times (seeds config.seed, +1, ...; each in its own directory under
// config.work_dir) and merges the runs' keys: throughput_ratio and after_ratio are the median,
// each run's value listed in <key>_runs; max_stall_s and stall_s_before the largest;
// server_cpu_share(_before) the mean; params_match, recovered, fault_steps and (full disk)
// ckpt_failures the smallest (what every run must show); train_exit the first non-zero;
// ckpt_skipped, server_kills and (outage) ckpt_failures summed; <scenario>_runs = runs. A median, as one run's ratio is noise-bound on a
// shared host: the same job with no fault at all measured 0.90-1.14 in place of 1.
absl::Status RunStallDrillRepeated(StallDrillConfig config, int runs,
                                   std::map<std::string, std::string>* kv);

// Targets of the keys above for `fault`; appends " key=value" of each one missed to `why`.
bool StallTargetsMet(StallFault fault, const std::map<std::string, std::string>& kv,
                     std::string* why);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_STALL_SCENARIO_H_
