// Helpers of the fault drill (benchmarks/fault_drill): its options and the format of its
// results.
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

namespace gradsnap {
namespace drill {

struct DrillOptions {
  std::string server_bin;  // gradsnap-server
  std::string train_bin;   // gradsnap-train (training scenario)
  std::string work_dir;    // parent of the drill's temporary directories
  int rounds = 4;          // storage: damage-and-rebuild rounds
  uint64_t shard_bytes = 8 << 20;
  uint64_t seed = 1;
  bool keep = false;       // keep the temporary directories (for a post-mortem)
  // Training scenario (training_scenario.h):
  int kills = 20;          // server SIGKILLs while the job trains
  bool quick = false;      // CI-sized: shorter outages and runs
  // Stall scenarios (stall_scenario.h): steps the fault lasts; 0: the scenario's default.
  int64_t fault_steps = 0;
};

// A drill run as a test: the build's gradsnap-server and gradsnap-train in `bin_dir`, the
// temporary directories under `work_dir`; `quick`: CI-sized.
DrillOptions TestDrillOptions(const std::string& bin_dir, const std::string& work_dir,
                              uint64_t seed, bool quick);

// Writes each count of `counts` into `kv` as its decimal string.
void PutCounts(std::initializer_list<std::pair<const char*, int64_t>> counts,
               std::map<std::string, std::string>* kv);

// "k=v k=v ..." of a scenario's results, in key order.
std::string FormatKv(const std::map<std::string, std::string>& kv);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_
