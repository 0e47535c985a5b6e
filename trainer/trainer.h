// One rank of a gradsnap-train job: initialization or resume, the training loop with its
// checkpointing hooks (checkpointer.h), and the per-step and summary output.
//
// Output (rank 0, stdout; docs/trainer.md):
//   step S loss L step_ms T stall_ms X
//   summary model=M nproc=P step=S steps_run=N tokens=K tokens_per_s=R mean_step_ms=M
//     stall_ms_total=X resumed_from=F params=N params_sha256=<hex>
//   (steps_run, tokens and the rates count this attempt; params_sha256 is the SHA-256 of the
//   final full fp32 parameters in ParamLayout order, little-endian).
//
// Thread safety: RunRank runs on the calling thread.
#ifndef GRADSNAP_TRAINER_TRAINER_H_
#define GRADSNAP_TRAINER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu_snapshot/sim_device.h"
#include "gradsnap/tls.h"
#include "trainer/checkpointer.h"

namespace gradsnap {
namespace trainer {

// --resume: where a run starts from in its store.
enum class ResumeKind { kNone, kLatest, kStep };
struct ResumeFrom {
  ResumeKind kind = ResumeKind::kNone;
  int64_t step = -1;  // kStep: the checkpoint's step (>= 0)
};
// "none", "latest" or a step number; INVALID_ARGUMENT "--resume must be none, latest or a step
// number, not 'X'" for anything else.
absl::StatusOr<ResumeFrom> ParseResume(absl::string_view text);

struct TrainOptions {
  std::string model = "tiny";  // Default: tiny
  std::string data;            // Default: empty = the default corpus (data.h)
  DeviceKind device = DeviceKind::kCpu;  // --device. Default: kCpu
  // The rank's device ordinal is device_id + local_rank (cuda, sim). Default: 0
  int device_id = 0;
  int local_rank = 0;          // the rank's index on its node (set by the launcher)
  gpu_snapshot::SimOptions sim;  // --device sim: copy bandwidth and test modes (sim_device.h)
  int64_t steps = 20;          // Default: 20
  int global_batch = 8;        // sequences per step, all ranks. Default: 8
  int seq_len = 0;             // tokens per sequence; 0 = the model's max_seq_len. Default: 0
  uint64_t seed = 1337;        // Default: 1337
  float lr = 6e-4f;            // peak learning rate. Default: 6e-4
  float min_lr_ratio = 0.1f;   // final LR = lr * ratio. Default: 0.1
  int64_t warmup_steps = -1;   // -1 = steps / 10. Default: -1
  float grad_clip = 1.0f;      // global-norm clip; 0 = off. Default: 1.0
  float weight_decay = 0.1f;   // Default: 0.1
  // Threads per rank: OpenBLAS's, and the CPU back end's pool (layers, AdamW, gradient norm).
  // --blas_threads resolves its 0 (cores per rank) before this. Default: 1
  int blas_threads = 1;
  // Parallelism (filled by the launcher).
  int rank = 0;
  int world_size = 1;
  std::string rdzv_dir;        // Gloo FileStore directory of this attempt
  std::string hostname = "127.0.0.1";
  // How long a training collective waits for a peer before the rank fails (a hung or frozen
  // rank then ends the attempt, and the launcher restarts it). Default: 300000
  int64_t collective_timeout_ms = 300000;
  int attempt = 0;             // 0 = first attempt
  // Checkpointing.
  CheckpointerOptions ckpt;
  std::vector<std::string> storage;  // --storage endpoints; empty = embedded
  int replicas = 1;  // copies of each shard across the storage endpoints. Default: 1
  // --etcd: cluster mode (docs/protocol.md "Cluster mode"): nodes, catalog and epochs from
  // etcd; excludes --storage. Default: empty.
  std::string etcd;
  // --etcd-ca/--etcd-cert/--etcd-key (https:// etcd endpoints), --etcd-user and its password
  // (--etcd-password-file or $GRADSNAP_ETCD_PASSWORD): client::ClientOptions' etcd_tls,
  // etcd_user, etcd_password. Default: empty.
  TlsFiles etcd_tls;
  std::string etcd_user;
  std::string etcd_password;
  // --replicas with --etcd: copies of each shard on the cluster's live nodes. Default: 3.
  int cluster_replicas = 3;
  // --min-replicas: with --etcd, copies that must be durable for a save. Default: 2.
  int min_replicas = 2;
  // Whether checkpoints go through servers (--storage or --etcd), not an embedded engine.
  bool RemoteStore() const { return !storage.empty() || !etcd.empty(); }
  std::string ckpt_dir = "checkpoints";
  std::string token;
  ResumeFrom resume;             // --resume none | latest | STEP. Default: none
  // Start from a `gradsnap restore` directory (any world size, or consolidated). Default: empty
  std::string init_from;
  // Resume a checkpoint of another global batch size (changes the data order). Default: false
  bool allow_batch_change = false;
  // Set by the launcher on a restarted attempt: when it saw the failure and when it started
  // this attempt (Unix ms), so rank 0 can print the recovery time. Default: -1
  int64_t recovery_failed_at_ms = -1;
  int64_t recovery_spawned_at_ms = -1;
  // Failure drill: rank fail_rank SIGKILLs itself at the start of step fail_at_step, attempt 0.
  int64_t fail_at_step = -1;
  int fail_rank = 0;
  // Freeze drill (testing): rank fail_rank SIGSTOPs itself in step test_freeze_at_step, after
  // enqueuing its forward and backward, attempt 0. -1: off.
  int64_t test_freeze_at_step = -1;
  // Where in that step (--test_freeze_before): "reduction" (after enqueuing the forward and
  // backward: the others wait in the gradient reduction) or "allgather" (after the update,
  // before its share of the parameter all-gather: the others' next wait for the device is a
  // checkpoint hook's, at a FULL step). Default: "reduction"
  std::string test_freeze_before = "reduction";
  // Test hook: before the drill's kill, wait until the job has a committed checkpoint (one rank
  // or --storage), so a test can require that the restart restores one.
  bool test_fail_after_commit = false;
  // Test hook: the update of this step is skipped as if its gradient norm were not finite.
  int64_t test_skip_step = -1;
  // Test hook: every step sleeps this long first (fault drills need a job that lasts). 0 = off.
  int64_t test_step_delay_ms = 0;
};

// Runs this rank to completion. Errors: INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION for
// bad input or a mismatched checkpoint (not worth a restart), anything else for failures.
// `before_teardown`, when given, is called with a failure while the rank's parts (store
// client, checkpointer, collectives) still stand, before their orderly teardown; the rank's
// main uses it to end a failed attempt at once (train_main.cc).
absl::Status RunRank(const TrainOptions& options,
                     const std::function<void(const absl::Status&)>& before_teardown = nullptr);

// The launcher's check before it starts any rank: with checkpointing or resume on, opens the
// store and lists the job. A permanent refusal (UNAUTHENTICATED, PERMISSION_DENIED,
// INVALID_ARGUMENT) is returned; anything else (e.g. a server still starting) is left to the
// ranks and their restarts.
absl::Status CheckStoreAccess(const TrainOptions& options);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_TRAINER_H_
