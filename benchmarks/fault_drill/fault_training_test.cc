// The training fault drills as tests, against the real gradsnap-server and
// gradsnap-train (2 ranks, gockpt + gradient log, tiny model):
//  - the server SIGKILLed >= 20 times at random moments and restarted after an outage (and one
//    rank killed mid-storm by the drill): the job finishes without a launcher restart caused by
//    storage, with the params_sha256 of an uninterrupted run,
//    reports ckpt_failures > 0; every listed checkpoint verifies, none is partial, no DELTA is
//    listed without its FULL or with a hole before it; `--resume latest` right after is exact;
//  - the server down longer than the backlog holds (many persists fail in a row): the same.
// GRADSNAP_DRILL_LONG builds the long variant (outages of 0.5-3 s, a longer job).
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmarks/fault_drill/training_scenario.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace gradsnap {
namespace drill {
namespace {

// The long variant's tests get their own suite name: ctest names tests by suite and name, and
// the label `long` must not reach the CI-sized ones.
#if defined(GRADSNAP_DRILL_LONG)
constexpr bool kLong = true;
#define GRADSNAP_DRILL_SUITE FaultTrainingLongTest
#else
constexpr bool kLong = false;
#define GRADSNAP_DRILL_SUITE FaultTrainingTest
#endif

DrillOptions Options(const testing::TempDir& work_dir, int kills) {
  DrillOptions o = TestDrillOptions(GRADSNAP_BIN_DIR, work_dir.path(), 20261130, !kLong);
  o.kills = kills;
  return o;
}

void ExpectSurvived(const std::map<std::string, std::string>& kv) {
  std::string all;
  for (const auto& [k, v] : kv) absl::StrAppend(&all, k, "=", v, " ");
  SCOPED_TRACE(all);
  // What the job wrote is still there (every recovery point it printed, no PENDING left), the
  // resume starts at the last one and reads back the job's final parameters.
  for (const char* zero : {"train_exit", "train_restarts_caused_by_storage", "lost_data",
                           "verify_errors", "partial_listed", "orphan_deltas_listed",
                           "chain_holes_listed", "spec_conflicts", "recovery_points_lost",
                           "pending_left"}) {
    EXPECT_EQ(kv.at(zero), "0") << zero;
  }
  for (const char* one : {"params_match", "resume_ok", "resume_from_recovery_point",
                          "restored_params_match"}) {
    EXPECT_EQ(kv.at(one), "1") << one;
  }
  for (const char* some : {"ckpt_failures", "listed_fulls", "recovery_points_seen"}) {
    EXPECT_GT(std::stoi(kv.at(some)), 0) << some;
  }
}

TEST(GRADSNAP_DRILL_SUITE, ServerKilledTwentyTimesWhileTraining) {
  const testing::TempDir dir("drill-kills");
  const DrillOptions o = Options(dir, 20);
  std::map<std::string, std::string> kv;
  const absl::Status st = RunTrainingScenario(o, &kv);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_GE(std::stoi(kv.at("server_kills")), 20);
  // The drill's own rank kill mid-storm: one restart, which resumes from the recovery point of
  // that moment, or from scratch when the storm let no FULL commit before it (steps_lost_max
  // says which); either way the job ends with the reference's parameters (ExpectSurvived).
  EXPECT_EQ(kv.at("train_restarts"), "1");
  ExpectSurvived(kv);
}

TEST(GRADSNAP_DRILL_SUITE, ServerDownLongerThanTheBacklogHolds) {
  // One outage of several seconds: every persist in it fails after its 300 ms of retries, the
  // one DELTA buffer and the one FULL in flight cannot hold it, so work is dropped; the job
  // goes on, and checkpoints resume once the server is back.
  const testing::TempDir dir("drill-outage");
  TrainingDrillConfig c = TrainingDrillFor(Options(dir, 1));
  c.kills = 1;
  c.down_ms_min = c.down_ms_max = kLong ? 20000 : 4000;
  c.up_ms_min = c.up_ms_max = 200;
  c.steps = kLong ? 400 : 90;
  c.fail_at_step = 0;
  std::map<std::string, std::string> kv;
  const absl::Status st = RunTrainingDrill(c, &kv);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(kv.at("server_kills"), "1");
  ExpectSurvived(kv);
}

}  // namespace
}  // namespace drill
}  // namespace gradsnap
