// fault_drill: drills against real gradsnap processes, the numbers of an operator's worst day.
//
//   fault_drill [--scenario storage|training|stall_full_disk|stall_outage|all] [--rounds N]
//               [--shard_bytes B] [--check]
//
// Scenarios (each in its own file): storage (storage_scenario.h: catalog loss and rebuild,
// SIGKILL mid-upload, orphan DELTAs, a second server on the port), training
// (training_scenario.h: a 2-rank gockpt + gradient-log job of gradsnap-train while its
// gradsnap-server is SIGKILLed --kills times at random moments), stall_full_disk and
// stall_outage (stall_scenario.h: the job's steps while its server's disk is full, or while
// the server is killed and restarted over and over; --stall_runs runs of each, the median
// ratio). Keys both scenarios report (orphan_deltas_listed) are summed; the stall scenarios'
// worst figures are also reported as train_throughput_during_fault_ratio (the lowest) and
// max_step_stall_s_during_fault (the highest). The last line of the output is the name=value
// pairs of every scenario that ran, merged. With --check the exit status is 1 when a result
// misses its target (the ctest `fault_drill_storage` runs a short drill so).
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "benchmarks/common/bench_util.h"
#include "benchmarks/fault_drill/drill_util.h"
#include "benchmarks/fault_drill/stall_scenario.h"
#include "benchmarks/fault_drill/storage_scenario.h"
#include "benchmarks/fault_drill/training_scenario.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(std::string, scenario, "all", "storage, training, stall_full_disk, stall_outage or all. Default: all.");
ABSL_FLAG(int, rounds, 4, "Storage: damage-and-rebuild rounds (catalog removed, emptied, "
          "CURRENT deleted, SSTs corrupted, in turn). Default: 4.");
ABSL_FLAG(uint64_t, shard_bytes, 8 << 20, "Storage: bytes of each shard's big tensor. Default: 8388608.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the data and of the kill timing. Default: 1.");
ABSL_FLAG(std::string, work_dir, "/tmp", "Parent of the drill's temporary directories. Default: /tmp.");
ABSL_FLAG(bool, keep, false, "Keep the temporary directories. Default: false.");
ABSL_FLAG(bool, check, false, "Exit 1 when a result misses its target. Default: false.");
ABSL_FLAG(std::string, server_bin, GRADSNAP_SERVER_BIN, "gradsnap-server binary. Default: the build's.");
ABSL_FLAG(std::string, train_bin, GRADSNAP_TRAIN_BIN, "gradsnap-train binary. Default: the build's.");
ABSL_FLAG(int, kills, 20, "Training: server SIGKILLs while the job trains. Default: 20.");
ABSL_FLAG(bool, quick, false, "Training: CI-sized, shortest outages (0.5-0.8 s) and a shorter job; stall_full_disk and stall_outage: 120 steps of fault. Default: false.");
ABSL_FLAG(std::string, stall_server_sched, "idle", "stall_full_disk and stall_outage: the server's CPU scheduling: idle (SCHED_IDLE, so on this one host it takes only the cycles the ranks leave, as a storage node on its own machine takes none of theirs) or normal (co-located: its restarts and work compete with the ranks). Default: idle.");
ABSL_FLAG(std::string, stall_server_flags, "", "stall_full_disk and stall_outage: extra gradsnap-server flags, space-separated (e.g. \"--prefault-uploads=0\"), for every start and restart. Default: none.");
ABSL_FLAG(int, stall_runs, 3, "stall_full_disk and stall_outage: runs of each scenario; its throughput ratios are their median (each run's listed in <key>_runs), its stalls the worst run's. Default: 3.");
ABSL_FLAG(int64_t, fault_steps, 0, "stall_full_disk and stall_outage: steps the fault lasts; 0 = 200 (120 with --quick). Default: 0.");

namespace {

// Training targets: the job survived every server kill without a storage-caused restart, and
// the store lists nothing partial, orphaned or damaged.
bool TrainingTargetsMet(const std::map<std::string, std::string>& kv, int kills,
                        std::string* why) {
  static const std::pair<const char*, const char*> kTargets[] = {
      {"train_restarts_caused_by_storage", "0"}, {"lost_data", "0"}, {"partial_listed", "0"},
      {"chain_holes_listed", "0"}, {"spec_conflicts", "0"}, {"params_match", "1"},
      {"resume_ok", "1"}, {"train_exit", "0"}, {"verify_errors", "0"},
      {"orphan_deltas_listed", "0"}, {"recovery_points_lost", "0"}, {"pending_left", "0"},
      {"resume_from_recovery_point", "1"}, {"restored_params_match", "1"}};
  bool met = true;
  // Every kill asked for happened (the job outlived the storm), and the job named a recovery
  // point to check.
  if (kv.count("server_kills") == 0 || std::atoi(kv.at("server_kills").c_str()) < kills) {
    met = false;
    *why += " server_kills<" + std::to_string(kills);
  }
  if (kv.count("recovery_points_seen") == 0 || kv.at("recovery_points_seen") == "0") {
    met = false;
    *why += " recovery_points_seen=0";
  }
  for (const auto& [key, want] : kTargets) {
    auto it = kv.find(key);
    if (it == kv.end() || it->second != want) {
      met = false;
      *why += std::string(" ") + key + "=" + (it == kv.end() ? "?" : it->second);
    }
  }
  return met;
}

// Adds `from` to `into`; a key both hold is summed (integers) or kept from `into`.
void MergeKv(const std::map<std::string, std::string>& from,
             std::map<std::string, std::string>* into) {
  for (const auto& [k, v] : from) {
    auto it = into->find(k);
    if (it == into->end()) {
      (*into)[k] = v;
      continue;
    }
    char* e1 = nullptr;
    char* e2 = nullptr;
    const long long a = std::strtoll(it->second.c_str(), &e1, 10);
    const long long b = std::strtoll(v.c_str(), &e2, 10);
    if (*e1 == '\0' && *e2 == '\0') it->second = std::to_string(a + b);
  }
}

}  // namespace

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(argc, argv,
                                 "fault_drill [--scenario storage|training|all] [--check]");
  const gradsnap::drill::DrillOptions o{
      .server_bin = absl::GetFlag(FLAGS_server_bin),
      .train_bin = absl::GetFlag(FLAGS_train_bin),
      .work_dir = absl::GetFlag(FLAGS_work_dir),
      .rounds = absl::GetFlag(FLAGS_rounds),
      .shard_bytes = absl::GetFlag(FLAGS_shard_bytes),
      .seed = absl::GetFlag(FLAGS_seed),
      .keep = absl::GetFlag(FLAGS_keep),
      .kills = absl::GetFlag(FLAGS_kills),
      .quick = absl::GetFlag(FLAGS_quick),
      .fault_steps = absl::GetFlag(FLAGS_fault_steps),
      .stall_server_idle = absl::GetFlag(FLAGS_stall_server_sched) == "idle",
      .stall_server_flags = absl::StrSplit(absl::GetFlag(FLAGS_stall_server_flags), ' ',
                                           absl::SkipEmpty())};
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  if (scenario != "storage" && scenario != "training" && scenario != "stall_full_disk" &&
      scenario != "stall_outage" && scenario != "all") {
    std::fprintf(stderr,
                 "fault_drill: --scenario must be storage, training, stall_full_disk, "
                 "stall_outage or all\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_stall_server_sched) != "idle" &&
      absl::GetFlag(FLAGS_stall_server_sched) != "normal") {
    std::fprintf(stderr, "fault_drill: --stall_server_sched must be idle or normal\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_stall_runs) < 1 || absl::GetFlag(FLAGS_stall_runs) > 50) {
    std::fprintf(stderr, "fault_drill: --stall_runs must be 1..50\n");
    return 2;
  }
  if (o.fault_steps < 0) {
    std::fprintf(stderr, "fault_drill: --fault_steps must be >= 0\n");
    return 2;
  }
  std::map<std::string, std::string> kv;
  bool met = true;
  std::string why;
  if (scenario == "storage" || scenario == "all") {
    absl::Status s = gradsnap::drill::RunStorageScenario(o, &kv);
    if (!s.ok()) {
      std::fprintf(stderr, "fault_drill: %s\n", s.ToString().c_str());
      return 1;
    }
    met = gradsnap::drill::StorageTargetsMet(kv, &why) && met;
  }
  if (scenario == "training" || scenario == "all") {
    gradsnap::testing::TempDir tree("drill-training", o.work_dir, o.keep);
    gradsnap::drill::DrillOptions t = o;
    t.work_dir = tree.path();
    std::map<std::string, std::string> tkv;
    absl::Status s = gradsnap::drill::RunTrainingScenario(t, &tkv);
    if (!s.ok()) {
      std::fprintf(stderr, "fault_drill: training scenario: %s\n", s.ToString().c_str());
      return 1;
    }
    met = TrainingTargetsMet(tkv, o.kills, &why) && met;
    MergeKv(tkv, &kv);
  }
  double worst_ratio = -1, worst_stall = -1;
  for (const gradsnap::drill::StallFault f :
       {gradsnap::drill::StallFault::kFullDisk, gradsnap::drill::StallFault::kOutage}) {
    const std::string name = gradsnap::drill::StallFaultName(f);
    if (scenario != name && scenario != "all") continue;
    gradsnap::testing::TempDir tree("drill-" + name, o.work_dir, o.keep);
    gradsnap::drill::DrillOptions t = o;
    t.work_dir = tree.path();
    std::map<std::string, std::string> skv;
    absl::Status s = gradsnap::drill::RunStallDrillRepeated(
        gradsnap::drill::StallDrillFor(t, f), absl::GetFlag(FLAGS_stall_runs), &skv);
    if (!s.ok()) {
      std::fprintf(stderr, "fault_drill: %s scenario: %s\n", name.c_str(), s.ToString().c_str());
      return 1;
    }
    met = gradsnap::drill::StallTargetsMet(f, skv, &why) && met;
    const double ratio = std::stod(skv.at(name + "_throughput_ratio"));
    const double stall = std::stod(skv.at(name + "_max_stall_s"));
    worst_ratio = worst_ratio < 0 ? ratio : std::min(worst_ratio, ratio);
    worst_stall = std::max(worst_stall, stall);
    MergeKv(skv, &kv);
  }
  if (worst_ratio >= 0) {
    kv["train_throughput_during_fault_ratio"] = absl::StrFormat("%.3f", worst_ratio);
    kv["max_step_stall_s_during_fault"] = absl::StrFormat("%.3f", worst_stall);
  }
  std::printf("%s\n", gradsnap::drill::FormatKv(kv).c_str());
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_check) && !met) {
    std::fprintf(stderr, "fault_drill: targets missed:%s\n", why.c_str());
    return 1;
  }
  return 0;
}
