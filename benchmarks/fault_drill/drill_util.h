// Helpers of the fault drill (benchmarks/fault_drill): its options and the format of its
// results.
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

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
  // Stall scenarios: the server runs under SCHED_IDLE (`chrt --idle 0`), so on this one host it
  // takes only the cycles the ranks leave, as a storage node on its own machine would take none
  // of theirs; false: normal priority, its restarts and work compete with the ranks' cores.
  bool stall_server_idle = true;
  // Stall scenarios: extra gradsnap-server flags for every start (--stall_server_flags).
  std::vector<std::string> stall_server_flags = {};
};

// A drill run as a test: the build's gradsnap-server and gradsnap-train in `bin_dir`, the
// temporary directories under `work_dir`; `quick`: CI-sized.
DrillOptions TestDrillOptions(const std::string& bin_dir, const std::string& work_dir,
                              uint64_t seed, bool quick);

// A shard the drill saves, with the bytes it wrote (to compare restores with).
struct DrillShard {
  client::ShardSpec spec;
  std::vector<std::string> data;  // per tensor
  std::vector<client::TensorRef> Refs() const;
};

// Three fp32 tensors of pseudo-random bytes from `rng`: `big` bytes (rounded down to 4), 4 KiB
// and 8 bytes.
DrillShard MakeDrillShard(const std::string& job, int64_t step, int32_t rank, uint64_t big,
                          std::mt19937_64* rng);

// The spec of a FULL (base < 0) or of a DELTA on `base`.
client::CheckpointSpec DrillSpec(const std::string& job, int64_t step, int32_t world,
                                 int64_t base = -1);

// True when every tensor of `s` restores through `c` (RestoreTensor, verified) as written.
bool RestoresAsWritten(client::Client* c, const DrillShard& s);

// What a drill wrote of each checkpoint, by step (every rank).
using WrittenShards = std::map<int64_t, std::vector<DrillShard>>;
// Shards of `steps` in `written` whose restore (every tensor) fails or differs from the bytes
// written: a store must serve what was saved, not merely what its footers say.
int ShardsNotRestored(client::Client* c, const WrittenShards& written,
                      const std::set<int64_t>& steps);

// A remote client of `endpoints` (2 attempts, 20 s per call).
absl::StatusOr<std::unique_ptr<client::Client>> ConnectDrill(
    const std::vector<std::string>& endpoints);

// Writes each count of `counts` into `kv` as its decimal string.
void PutCounts(std::initializer_list<std::pair<const char*, int64_t>> counts,
               std::map<std::string, std::string>* kv);

// "k=v k=v ..." of a scenario's results, in key order.
std::string FormatKv(const std::map<std::string, std::string>& kv);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_
