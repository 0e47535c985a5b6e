// The gradsnap-train launcher (like torchrun): starts the ranks of this node as child processes
// of the same binary, watches them, and restarts the whole job when one dies.
//
// OVERVIEW
//   Attempt k runs `nproc` children: argv[0] = /proc/self/exe, the user's flags, then
//   --rank G --world_size W --attempt k --rdzv_dir RDZV/attempt-k (G = node_rank * nproc + i),
//   and from attempt 1 on --resume latest (when checkpointing is on). When a child exits
//   non-zero or by a signal, the launcher stops the others (SIGTERM, then SIGKILL after a grace
//   period) and starts attempt k+1, up to max_restarts times. With several nodes it also says
//   so in RDZV/attempt-k/failed, and a launcher that finds another node's such file while its
//   own ranks run stops them and starts attempt k+1 too (docs/trainer.md). Each launcher marks
//   the attempts it runs ranks in (RDZV/attempt-k/node-I); a launcher of several nodes that is
//   started again while the job runs joins it: at the newest attempt, or, when that holds its
//   own mark (its killed ranks were in it), at the next one, after saying the newest failed.
//   A child that exits with kExitNoRestart (bad input, a mismatched checkpoint) ends the job
//   at once: restarting cannot help.
//
// THREAD SAFETY
//   Launch runs on the main thread and installs SIGINT/SIGTERM handlers (forwarded to children).
#ifndef GRADSNAP_TRAINER_LAUNCHER_H_
#define GRADSNAP_TRAINER_LAUNCHER_H_

#include <functional>
#include <string>
#include <vector>

namespace gradsnap {
namespace trainer {

// Exit status of a rank for errors a restart cannot fix.
inline constexpr int kExitNoRestart = 2;

struct LaunchOptions {
  int nproc = 1;          // ranks on this node. Default: 1
  int nnodes = 1;         // nodes in the job. Default: 1
  int node_rank = 0;      // this node's index. Default: 0
  // Rendezvous directory shared by all nodes (Gloo FileStore). Default: empty = a fresh
  // temporary directory (single node only).
  std::string rdzv;
  int max_restarts = 0;   // Default: 0
  // Restarted attempts get --resume latest (false: they start over, e.g. --ckpt_mode none).
  // Default: true
  bool resume_on_restart = true;
  // Called between a failed attempt and the next one, while no rank runs. gradsnap-train sets
  // none: the next attempt's rank 0 rolls back what the failed one left PENDING. Default: none.
  std::function<void()> before_restart;
  // The flags passed through to every rank.
  std::vector<std::string> rank_args;
};

// Returns the process exit status: 0 when all ranks finished, else non-zero. Calls
// SetRankEnvironmentDefaults first.
int Launch(const LaunchOptions& options);

// The environment the ranks inherit, where the user's does not set it: OPENBLAS_THREAD_TIMEOUT=4
// (kOpenBlasThreadTimeout). OpenBLAS's idle threads otherwise spin on sched_yield for 2^28
// cycles (about 0.1 s) after each GEMM before they sleep, so between GEMMs one of them holds a
// core that the trainer's own pool (non-GEMM layers) and the checkpoint threads need; at 4 they
// sleep at once. Measured on 2 cores (docs/trainer.md): `small` trains 9 % faster without
// checkpoints and 12 % faster with gockpt + the gradient log. A value the user set is kept.
inline constexpr char kOpenBlasThreadTimeout[] = "4";
void SetRankEnvironmentDefaults();

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_LAUNCHER_H_
