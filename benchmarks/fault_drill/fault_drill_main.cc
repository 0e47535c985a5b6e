// fault_drill: drills gradsnap against the faults a user's job lives through and prints what
// survived. `--scenario training` (issue 9): a 2-rank gockpt + gradient-log job of gradsnap-train
// while its gradsnap-server is SIGKILLed --kills times at random moments (training_scenario.h).
// The last line holds the name=value pairs.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "benchmarks/fault_drill/drill_util.h"
#include "benchmarks/fault_drill/training_scenario.h"

ABSL_FLAG(std::string, scenario, "all", "training or all. Default: all");
ABSL_FLAG(std::string, bin_dir, "", "Directory of gradsnap-server and gradsnap-train. Default: this binary's directory");
ABSL_FLAG(std::string, work_dir, "", "Scratch directory. Default: a fresh one under /tmp");
ABSL_FLAG(int, kills, 20, "Server SIGKILLs in the training scenario. Default: 20");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the random moments and outages. Default: 1");
ABSL_FLAG(bool, quick, false, "CI-sized: shortest outages (0.5-0.8 s), shorter job. Default: false");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  gradsnap::drill::DrillOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (o.bin_dir.empty()) {
    o.bin_dir = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  }
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (o.work_dir.empty()) {
    char tmpl[] = "/tmp/gradsnap-drill-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::fprintf(stderr, "fault_drill: mkdtemp failed\n");
      return 1;
    }
    o.work_dir = tmpl;
  }
  o.kills = absl::GetFlag(FLAGS_kills);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.quick = absl::GetFlag(FLAGS_quick);
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  if (scenario != "training" && scenario != "all") {
    std::fprintf(stderr, "fault_drill: unknown --scenario %s (training, all)\n", scenario.c_str());
    return 2;
  }
  std::map<std::string, std::string> kv;
  absl::Status s = gradsnap::drill::RunTrainingScenario(o, &kv);
  if (!s.ok()) {
    std::fprintf(stderr, "fault_drill: training scenario: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("work_dir %s\n", o.work_dir.c_str());
  std::printf("%s\n", absl::StrJoin(kv, " ", absl::PairFormatter("=")).c_str());
  return 0;
}
