// fault_drill: drills against real gradsnap processes, the numbers of an operator's worst day.
//
//   fault_drill [--scenario storage|training|all] [--rounds N] [--shard_bytes B] [--check]
//
// Scenarios (each in its own file): storage (storage_scenario.h: catalog loss and rebuild,
// SIGKILL mid-upload, orphan DELTAs, a second server on the port). The last line of the output
// is the name=value pairs of every scenario that ran, merged. With --check the exit status is 1
// when a result misses its target (the ctest `fault_drill_storage` runs a short drill so).
#include <cstdio>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "benchmarks/fault_drill/drill_util.h"
#include "benchmarks/fault_drill/storage_scenario.h"
#include "common/logging.h"

ABSL_FLAG(std::string, scenario, "all", "storage, training or all. Default: all.");
ABSL_FLAG(int, rounds, 4, "Storage: damage-and-rebuild rounds (catalog removed, emptied, "
          "CURRENT deleted, SSTs corrupted, in turn). Default: 4.");
ABSL_FLAG(uint64_t, shard_bytes, 8 << 20, "Storage: bytes of each shard's big tensor. Default: 8388608.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the data and of the kill timing. Default: 1.");
ABSL_FLAG(std::string, work_dir, "/tmp", "Parent of the drill's temporary directories. Default: /tmp.");
ABSL_FLAG(bool, keep, false, "Keep the temporary directories. Default: false.");
ABSL_FLAG(bool, check, false, "Exit 1 when a result misses its target. Default: false.");
ABSL_FLAG(std::string, server_bin, GRADSNAP_SERVER_BIN, "gradsnap-server binary. Default: the build's.");
ABSL_FLAG(std::string, cli_bin, GRADSNAP_CLI_BIN, "gradsnap binary. Default: the build's.");
ABSL_FLAG(std::string, train_bin, GRADSNAP_TRAIN_BIN, "gradsnap-train binary. Default: the build's.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("fault_drill [--scenario storage|training|all] [--check]");
  absl::ParseCommandLine(argc, argv);
  if (std::getenv("GRADSNAP_LOG_LEVEL") == nullptr) {
    gradsnap::SetLogLevel(gradsnap::LogLevel::kWarning);
  }
  gradsnap::drill::DrillOptions o;
  o.server_bin = absl::GetFlag(FLAGS_server_bin);
  o.cli_bin = absl::GetFlag(FLAGS_cli_bin);
  o.train_bin = absl::GetFlag(FLAGS_train_bin);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  o.rounds = absl::GetFlag(FLAGS_rounds);
  o.shard_bytes = absl::GetFlag(FLAGS_shard_bytes);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.keep = absl::GetFlag(FLAGS_keep);
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  if (scenario != "storage" && scenario != "training" && scenario != "all") {
    std::fprintf(stderr, "fault_drill: --scenario must be storage, training or all\n");
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
    // MERGE POINT (issue 9): call RunTrainingScenario(o, &kv) from
    // benchmarks/fault_drill/training_scenario.h here, with its targets in `met`/`why`.
    if (scenario == "training") {
      std::fprintf(stderr, "fault_drill: the training scenario is not part of this build\n");
      return 2;
    }
  }
  std::printf("%s\n", gradsnap::drill::FormatKv(kv).c_str());
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_check) && !met) {
    std::fprintf(stderr, "fault_drill: targets missed:%s\n", why.c_str());
    return 1;
  }
  return 0;
}
