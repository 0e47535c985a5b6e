// The training scenario of the fault drill: a 2-rank gockpt + gradient-log job of
// gradsnap-train trains while its gradsnap-server is SIGKILLed at random moments and restarted
// after a random outage; then the store is checked and the job is resumed right away.
//
// Keys (RunTrainingScenario): server_kills, train_restarts (all launcher restarts),
// train_restarts_caused_by_storage (restarts beyond the one the drill causes by killing a rank
// mid-storm; target 0), ckpt_failures (the job's summary), lost_data,
// partial_listed, orphan_deltas_listed, chain_holes_listed, verify_errors, spec_conflicts
// (refusals of a checkpoint "with another spec", as ranks diverging on base_step cause) (all
// target 0), listed_fulls, listed_deltas, params_match (1:
// the job's params_sha256 equals an uninterrupted run's), resume_ok (1: `--resume latest` right
// after finished with the same params_sha256), fallbacks (resume fallbacks the trainer printed,
// lines starting "fall back"), steps_lost_max (steps between the rank kill and the step the
// restarted job resumed from), recovery_lag_max (the most steps between a step and the recovery
// point its step line reported: what a failure at the worst moment would have lost),
// steps_lost_resume (steps between the job's end and the step the resume right after started
// from), train_exit (the job's exit status), recovery_points_seen and recovery_points_lost
// (every recovery point the step lines printed, and those not listed committed or not
// verifying at the end; target 0), pending_left (PENDING checkpoints listed at the end; 0),
// resume_from_recovery_point (1: the resume started at the job's last recovery point),
// restored_params_match (1: that point is the last step and the resume printed the job's final
// params_sha256, read back from the store).
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_SCENARIO_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_SCENARIO_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "benchmarks/fault_drill/training_util.h"

namespace gradsnap {
namespace drill {

// Everything a server-kill drill varies; TrainingDrillFor(opts) gives the scenario's defaults.
struct TrainingDrillConfig {
  std::string server_bin, train_bin, work_dir;
  uint64_t seed = 1;
  int kills = 20;                 // SIGKILLs of the server while the job trains
  int down_ms_min = 500, down_ms_max = 3000;  // outage after each kill
  int up_ms_min = 100, up_ms_max = 1000;      // uptime between kills
  int64_t steps = 300;            // the job's steps; it must outlast the kills
  int64_t step_delay_ms = 100;    // --test_step_delay_ms, so the job lasts
  int64_t persist_timeout_ms = 300;  // --ckpt_persist_timeout_ms of the job
  // Rank 1 SIGKILLs itself at this step of the first attempt (--fail_at_step), so the job also
  // restarts and resumes in the middle of the storm; 0 = no rank kill.
  int64_t fail_at_step = 0;
};
TrainingDrillConfig TrainingDrillFor(const DrillOptions& opts);

absl::Status RunTrainingDrill(const TrainingDrillConfig& config,
                              std::map<std::string, std::string>* kv);

// RunTrainingDrill(TrainingDrillFor(opts), kv).
absl::Status RunTrainingScenario(const DrillOptions& opts,
                                 std::map<std::string, std::string>* kv);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_SCENARIO_H_
