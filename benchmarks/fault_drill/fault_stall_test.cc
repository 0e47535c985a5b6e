// The stall drills as tests (stall_scenario.h), against the real gradsnap-server and
// gradsnap-train (2 ranks, gockpt + gradient log, tiny model), each fault 120 steps long:
//  - the server's disk full (every upload refused RESOURCE_EXHAUSTED), then freed;
//  - the server SIGKILLed and restarted over and over.
// Each time the job ends with the params_sha256 of an uninterrupted run, counts failed
// persists, commits a checkpoint again after the fault, and its steps are not held: no step
// during the fault stalls for as long as half the back-off (the old policy retried each
// persist for --ckpt-persist-timeout-ms while the step waited for its buffer), and the steps
// are no slower than half as fast as the same job's own before or after the fault, whichever
// were slower. (The drill's
// targets, >= 0.90 and <= 0.5 s, are checked by `fault_drill --check`; a test on a shared CI
// machine asserts only margins no scheduler noise crosses.)
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmarks/fault_drill/stall_scenario.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace drill {
namespace {

std::map<std::string, std::string> RunAndCheck(StallFault fault) {
  const testing::TempDir dir("drill-stall");
  DrillOptions o = TestDrillOptions(GRADSNAP_BIN_DIR, dir.path(), 20261203, true);
  // Normal priority: under ctest -j2 another test keeps the cores busy, and a SCHED_IDLE
  // server would be starved (its start-up alone could outlast the fault).
  o.stall_server_idle = false;
  std::map<std::string, std::string> kv;
  const StallDrillConfig c = StallDrillFor(o, fault);
  const absl::Status st = RunStallDrill(c, &kv);
  EXPECT_TRUE(st.ok()) << st;
  std::string all;
  for (const auto& [k, v] : kv) absl::StrAppend(&all, k, "=", v, " ");
  std::printf("%s\n", all.c_str());
  const std::string p = std::string(StallFaultName(fault)) + "_";
  if (!st.ok()) return kv;
  SCOPED_TRACE(all);
  EXPECT_EQ(kv.at(p + "train_exit"), "0");
  EXPECT_EQ(kv.at(p + "params_match"), "1");
  // A full disk fails every persist; a server that restarts within the client's quick retries
  // may fail none, so only the kills are required there.
  if (std::string(StallFaultName(fault)) == "stall_full_disk") {
    EXPECT_GT(std::stoi(kv.at(p + "ckpt_failures")), 0);
  } else {
    EXPECT_GT(std::stoi(kv.at(p + "server_kills")), 0);
  }
  EXPECT_EQ(kv.at(p + "recovered"), "1");
  EXPECT_GT(std::stoi(kv.at(p + "fault_steps")), 60);
  EXPECT_LT(std::stod(kv.at(p + "max_stall_s")) * 1000, c.persist_timeout_ms / 2.0);
  // The steps during the fault against the job's own steps without one, before or after it,
  // whichever ran slower: other tests that load the machine more during the fault's window
  // slow the steps after it too (CI saw 0.49 during the fault with 0.42 after it, against the
  // steps before). Held steps are slow against both.
  const double after = std::stod(kv.at(p + "after_ratio"));
  EXPECT_GT(std::stod(kv.at(p + "throughput_ratio")), 0.5 * std::min(1.0, after));
  return kv;
}

TEST(FaultStallTest, FullDiskServerDoesNotHoldSteps) {
  if (!testing::Tmpfs(testing::TempDir("probe").path() + "/fs", 1).mounted()) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  }
  RunAndCheck(StallFault::kFullDisk);
}

TEST(FaultStallTest, ServerKilledOverAndOverDoesNotHoldSteps) {
  const std::map<std::string, std::string> kv = RunAndCheck(StallFault::kOutage);
  if (kv.count("stall_outage_server_kills") != 0) {
    EXPECT_GT(std::stoi(kv.at("stall_outage_server_kills")), 2);
  }
}

}  // namespace
}  // namespace drill
}  // namespace gradsnap
