// gradsnap-train: the bundled GPT trainer (DESIGN.md section 6, docs/trainer.md).
//
// Without --rank it is the launcher: it validates the flags, then starts --nproc ranks of itself
// and restarts them on failure (launcher.h). With the hidden --rank flag it is one rank.
// Flags may be spelled with dashes or underscores (--ckpt-mode or --ckpt_mode).
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "cluster/etcd_client.h"
#include "cluster/etcd_flags.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/names.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "gpu_snapshot/device_flags.h"
#include "gpu_snapshot/snapshot_mode.h"
#include "recovery/state_source.h"
#include "trainer/checkpointer_factory.h"
#include "trainer/data.h"
#include "trainer/full_shard.h"
#include "trainer/launcher.h"
#include "trainer/model_config.h"
#include "trainer/persist_backlog.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, data, "", "Training text file. Default: the Debian license texts in /usr/share/common-licenses");
ABSL_FLAG(std::string, model, "tiny", "Model: tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m. Default: tiny");
ABSL_FLAG(int64_t, steps, 20, "Training steps (also the cosine LR horizon). Default: 20");
ABSL_FLAG(int, batch, 8, "Global batch in sequences per step, divisible by the world size. Default: 8");
ABSL_FLAG(int, seq, 0, "Tokens per sequence; 0 = the model's context length. Default: 0");
ABSL_FLAG(double, lr, 6e-4, "Peak learning rate. Default: 6e-4");
ABSL_FLAG(double, min_lr_ratio, 0.1, "Final LR as a fraction of the peak. Default: 0.1");
ABSL_FLAG(int64_t, warmup, -1, "Warmup steps; -1 = steps/10. Default: -1");
ABSL_FLAG(double, grad_clip, 1.0, "Global gradient-norm clip; 0 = off. Default: 1.0");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW decoupled weight decay. Default: 0.1");
ABSL_FLAG(uint64_t, seed, 1337, "Seed of parameter init and data order. Default: 1337");
ABSL_FLAG(int, ckpt_thread_nice, 10, "Nice value (0..19) of the rank's persist-side checkpoint threads (the snapshot engine's worker and replay, the store persists, the embedded store's writer), which run under SCHED_BATCH, as the copy threads do at the training threads' nice value, so that none preempts a training thread on waking; 0 leaves every thread as it is. Default: 10");
ABSL_FLAG(int, blas_threads, 0, "Threads per rank: OpenBLAS's and the CPU back end's layers, optimizer and reductions (the results are the same bits with any count); 0 = the cores available to the process divided by the ranks on this node (--nproc), at least 1. Default: 0");
// --device, --device_id and --sim_copy_gbps: gpu_snapshot/device_flags.h.
ABSL_FLAG(bool, sim_poison, false, "(testing) sim: kernels poison the device memory they write while they run, so a misordered copy corrupts the checkpoint. Default: false");
ABSL_FLAG(bool, sim_unordered_copies, false, "(testing) sim: copies ignore compute-stream events (deliberately broken ordering). Default: false");
ABSL_FLAG(std::string, sim_late_copies, "none", "(testing) sim: none, state or grad: the copies of the state (or gradient) copy stream start as late as a GPU may start them, when the host waits for them or once a kernel overwrote their source, so a missing wait always corrupts the checkpoint (docs/gockpt.md). Default: none");
ABSL_FLAG(std::string, test_drop_wait, "none", "(testing) gockpt: none, block, grad or replay: the snapshot engine leaves out that kind of wait (breaks the checkpoints on purpose; docs/gockpt.md). Default: none");
ABSL_FLAG(int, nproc, 1, "Ranks on this node. Default: 1");
ABSL_FLAG(int, nnodes, 1, "Nodes in the job. Default: 1");
ABSL_FLAG(int, node_rank, 0, "This node's index in [0, nnodes). Default: 0");
ABSL_FLAG(std::string, rdzv, "", "Rendezvous directory shared by all nodes (required when nnodes > 1). Default: a fresh temp dir");
ABSL_FLAG(std::string, hostname, "127.0.0.1", "Address this node's ranks listen on for peers. Default: 127.0.0.1");
ABSL_FLAG(int64_t, collective_timeout_s, 300, "How long a training collective waits for a peer before the rank fails (a hung or frozen rank ends the attempt; with --max_restarts the launcher restarts it): Gloo's operations, and with --device cuda or sim every wait for device work that holds a collective (NCCL on cuda: the event is polled and the communicator aborted). 1..86400. Default: 300");
ABSL_FLAG(int, max_restarts, 0, "Job restarts after a rank failure. Default: 0");
ABSL_FLAG(std::string, ckpt_mode, "none", "none, sync, async or gockpt. Default: none");
ABSL_FLAG(int64_t, ckpt_every, 0, "FULL checkpoint every N steps; 0 = never. Default: 0");
ABSL_FLAG(bool, grad_log, false, "Stream per-step gradient DELTA records (gockpt builds). Default: false");
ABSL_FLAG(std::string, storage, "", "gradsnap-server endpoints host:port[,host:port...]. Default: empty = embedded engine in --ckpt_dir");
ABSL_FLAG(int, replicas, 1, "Copies of each checkpoint shard across the --storage endpoints (rendezvous hashing), 1..16 and at most their number; a restore reads any live copy. Default: 1");
ABSL_FLAG(std::string, ckpt_dir, "checkpoints", "Embedded engine directory. Default: checkpoints");
ABSL_FLAG(std::string, job, "job", "Job name in the store. Default: job");
ABSL_FLAG(std::string, etcd, "", "Cluster mode: etcd endpoints host:port[,host:port...]; storage nodes, catalog and epochs come from etcd (excludes --storage). Default: empty");
ABSL_FLAG(int, min_replicas, 2, "With --etcd: copies of a shard that must be durable for a save (1..16). Default: 2");
ABSL_FLAG(std::string, token, "", "Bearer token for --storage. Default: empty");
ABSL_FLAG(std::string, resume, "none", "none, latest or a step number; the checkpoint may have another world size (resharded exactly). Default: none");
ABSL_FLAG(std::string, init_from, "", "Start from a `gradsnap restore` directory (rank files of any world size, or --consolidate output); needs no store. Default: empty (off)");
ABSL_FLAG(bool, allow_batch_change, false, "Allow resuming a checkpoint written with another --batch (changes the data order). Default: false");
ABSL_FLAG(int64_t, fail_at_step, -1, "Failure drill: --fail_rank SIGKILLs itself at this step (first attempt only). Default: -1 (off)");
ABSL_FLAG(int, fail_rank, 0, "Failure drill rank. Default: 0");
ABSL_FLAG(bool, test_fail_after_commit, false, "(testing) the failure drill first waits until the job has a committed checkpoint (one rank or --storage). Default: false");
ABSL_FLAG(std::string, trace, "", "Write a Chrome/Perfetto trace-event JSON (compute phases, copies, replay, persists) to this file; each rank > 0 appends .rankR. Default: empty (off)");
ABSL_FLAG(int, gockpt_window, 0, "gockpt window K in steps; 0 = automatic (docs/gockpt.md). Default: 0");
ABSL_FLAG(bool, gockpt_overlap, true, "gockpt -O: gradient copies overlap the update instead of blocking. Default: true");
ABSL_FLAG(std::string, ckpt_on_failure, "continue", "What a checkpoint persist that fails after its retries does: continue (count it, keep training; the recovery point gets older) or stop (the rank fails like any error). Permanent errors (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, superseded) always stop the job. Default: continue");
ABSL_FLAG(int64_t, ckpt_persist_timeout_ms, 5000, "The longest back-off after failed checkpoint persists: a failed persist is not retried, the checkpoints after it are tried again no sooner than 100 ms later, doubling per further failure up to this (a full disk: this at once). Default: 5000");
ABSL_FLAG(std::string, ckpt_backlog_bytes, "auto", "async/gockpt: host memory per rank for checkpoints waiting for the store (bytes, or with a K/M/G suffix); a new checkpoint that does not fit is skipped and counted. auto: one FULL shard plus 8 DELTA records of the rank, at least 64 MiB. Default: auto");
ABSL_FLAG(bool, test_ignore_parent_death, false, "(testing) ranks survive their launcher, to drill zombie fencing. Default: false");
ABSL_FLAG(std::string, test_freeze_before, "reduction", "(testing) where --test_freeze_at_step freezes: reduction (after enqueuing the forward and backward) or allgather (after the update, before the parameter all-gather). Default: reduction");
ABSL_FLAG(int64_t, test_freeze_at_step, -1, "(testing) freeze drill: --fail_rank SIGSTOPs itself in this step, after enqueuing its forward and backward (first attempt only), so the others meet the collective deadline. Default: -1 (off)");
ABSL_FLAG(int64_t, test_step_delay_ms, 0, "(testing) sleep this long before every step, so fault drills have a job that lasts. Default: 0 (off)");
ABSL_FLAG(int64_t, test_skip_step, -1, "(testing) skip the optimizer update of this step as if its gradient were not finite. Default: -1 (off)");
// Set by the launcher for its children.
ABSL_FLAG(int, rank, -1, "(internal) global rank of this process");
ABSL_FLAG(int, world_size, 1, "(internal) ranks in the job");
ABSL_FLAG(int, attempt, 0, "(internal) restart attempt");
ABSL_FLAG(int, local_rank, 0, "(internal) the rank's index on its node");
ABSL_FLAG(std::string, rdzv_dir, "", "(internal) rendezvous directory of this attempt");
ABSL_FLAG(int64_t, recovery_failed_at_ms, -1, "(internal) when the launcher saw the previous attempt fail (Unix ms)");
ABSL_FLAG(int64_t, recovery_spawned_at_ms, -1, "(internal) when the launcher started this attempt (Unix ms)");
ABSL_FLAG(int, launcher_pid, 0, "(internal) pid of the launcher that started this rank");

namespace {

using gradsnap::trainer::kExitNoRestart;

// --blas_threads 0: the cores this process may run on (its affinity mask), divided by the ranks
// on this node, at least 1.
int CoresPerRank(int nproc) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  return std::max(1, cores / std::max(1, nproc));
}

// The options of the flags; strings with an enum (--device, --ckpt_mode, --resume) are parsed
// here, once.
// `replicas_given`: --replicas is on the command line (with --etcd it then overrides the
// cluster's default of 3 copies).
absl::StatusOr<gradsnap::trainer::TrainOptions> OptionsFromFlags(bool replicas_given) {
  namespace gs = gradsnap::gpu_snapshot;
  gradsnap::trainer::TrainOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.data = absl::GetFlag(FLAGS_data);
  ASSIGN_OR_RETURN(o.device, gs::DeviceFlag());
  o.device_id = absl::GetFlag(FLAGS_device_id);
  o.local_rank = absl::GetFlag(FLAGS_local_rank);
  o.sim.copy_gbps = absl::GetFlag(FLAGS_sim_copy_gbps);
  o.sim.poison = absl::GetFlag(FLAGS_sim_poison);
  o.sim.unordered_copies = absl::GetFlag(FLAGS_sim_unordered_copies);
  ASSIGN_OR_RETURN(o.sim.late_copies,
                   gs::ParseSimLateCopies(absl::GetFlag(FLAGS_sim_late_copies)));
  ASSIGN_OR_RETURN(o.ckpt.test_drop_wait,
                   gs::ParseDroppedWait(absl::GetFlag(FLAGS_test_drop_wait)));
  o.steps = absl::GetFlag(FLAGS_steps);
  o.global_batch = absl::GetFlag(FLAGS_batch);
  o.seq_len = absl::GetFlag(FLAGS_seq);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  o.min_lr_ratio = static_cast<float>(absl::GetFlag(FLAGS_min_lr_ratio));
  o.warmup_steps = absl::GetFlag(FLAGS_warmup);
  o.grad_clip = static_cast<float>(absl::GetFlag(FLAGS_grad_clip));
  o.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  o.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  if (o.blas_threads == 0) o.blas_threads = CoresPerRank(absl::GetFlag(FLAGS_nproc));
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.rdzv_dir = absl::GetFlag(FLAGS_rdzv_dir);
  o.hostname = absl::GetFlag(FLAGS_hostname);
  // Validate() refuses a value out of range; clamped here only so the product cannot overflow.
  o.collective_timeout_ms =
      std::clamp<int64_t>(absl::GetFlag(FLAGS_collective_timeout_s), 1, 86400) * 1000;
  o.attempt = absl::GetFlag(FLAGS_attempt);
  ASSIGN_OR_RETURN(o.ckpt.mode, gs::ParseSnapshotMode(absl::GetFlag(FLAGS_ckpt_mode)));
  o.ckpt.every = absl::GetFlag(FLAGS_ckpt_every);
  o.ckpt.grad_log = absl::GetFlag(FLAGS_grad_log);
  o.ckpt.job = absl::GetFlag(FLAGS_job);
  o.ckpt.gockpt_window = absl::GetFlag(FLAGS_gockpt_window);
  o.ckpt.overlap_grads = absl::GetFlag(FLAGS_gockpt_overlap);
  o.ckpt.trace_file = absl::GetFlag(FLAGS_trace);
  o.ckpt.persist_timeout_ms = absl::GetFlag(FLAGS_ckpt_persist_timeout_ms);
  const std::string on_failure = absl::GetFlag(FLAGS_ckpt_on_failure);
  if (on_failure != "continue" && on_failure != "stop") {
    return absl::InvalidArgumentError("--ckpt_on_failure must be continue or stop");
  }
  o.ckpt.stop_on_failure = on_failure == "stop";
  ASSIGN_OR_RETURN(o.ckpt.backlog_bytes,
                   gradsnap::trainer::ParseBacklogBytes(absl::GetFlag(FLAGS_ckpt_backlog_bytes)));
  o.test_skip_step = absl::GetFlag(FLAGS_test_skip_step);
  o.test_step_delay_ms = std::max<int64_t>(0, absl::GetFlag(FLAGS_test_step_delay_ms));
  const std::string storage = absl::GetFlag(FLAGS_storage);
  if (!storage.empty()) {
    o.storage = absl::StrSplit(storage, ',');
    if (std::find(o.storage.begin(), o.storage.end(), "") != o.storage.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--storage must be host:port[,host:port...] with no empty entry, not '", storage, "'"));
    }
  }
  o.replicas = absl::GetFlag(FLAGS_replicas);
  o.etcd = absl::GetFlag(FLAGS_etcd);
  o.min_replicas = absl::GetFlag(FLAGS_min_replicas);
  if (!o.etcd.empty() && !o.storage.empty()) {
    return absl::InvalidArgumentError("give --etcd or --storage, not both");
  }
  ASSIGN_OR_RETURN(const gradsnap::cluster::EtcdOptions eo,
                   gradsnap::cluster::EtcdOptionsFromCommandLine(o.etcd));
  o.etcd_tls = eo.tls_files;
  o.etcd_user = eo.user;
  o.etcd_password = eo.password;
  if (!o.etcd.empty()) {
    // --replicas places that many copies on the cluster (default 3 there, not 1).
    if (replicas_given) o.cluster_replicas = o.replicas;
    o.replicas = 1;
  }
  if (o.min_replicas < 1 || o.min_replicas > 16) {
    return absl::InvalidArgumentError("--min_replicas must be 1..16");
  }
  o.ckpt_dir = absl::GetFlag(FLAGS_ckpt_dir);
  o.token = absl::GetFlag(FLAGS_token);
  ASSIGN_OR_RETURN(o.resume, gradsnap::trainer::ParseResume(absl::GetFlag(FLAGS_resume)));
  o.init_from = absl::GetFlag(FLAGS_init_from);
  o.allow_batch_change = absl::GetFlag(FLAGS_allow_batch_change);
  o.recovery_failed_at_ms = absl::GetFlag(FLAGS_recovery_failed_at_ms);
  o.recovery_spawned_at_ms = absl::GetFlag(FLAGS_recovery_spawned_at_ms);
  o.fail_at_step = absl::GetFlag(FLAGS_fail_at_step);
  o.fail_rank = absl::GetFlag(FLAGS_fail_rank);
  o.test_fail_after_commit = absl::GetFlag(FLAGS_test_fail_after_commit);
  o.test_freeze_at_step = absl::GetFlag(FLAGS_test_freeze_at_step);
  o.test_freeze_before = absl::GetFlag(FLAGS_test_freeze_before);
  return o;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gradsnap-train: %s\n", msg.c_str());
  return kExitNoRestart;
}

// The address this node's ranks listen on must resolve and be bindable here (Gloo's device
// setup is not safe to feed a bad one).
std::string CheckHostname(const std::string& host) {
  if (host.empty() || host.size() > 253) return "--hostname must be a host name or address";
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
    return "--hostname " + host + ": cannot resolve (" + gai_strerror(rc) + ")";
  }
  std::string problem = "--hostname " + host + ": not an address of this machine";
  for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
    const int fd = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
    if (fd < 0) continue;
    const bool ok = bind(fd, p->ai_addr, p->ai_addrlen) == 0;
    close(fd);
    if (ok) {
      problem.clear();
      break;
    }
  }
  freeaddrinfo(res);
  return problem;
}

// Launcher-side checks, so bad input fails once with one clear line instead of in every rank.
int Validate(const gradsnap::trainer::TrainOptions& o, int nproc, int nnodes, int node_rank) {
  namespace t = gradsnap::trainer;
  if (nproc < 1 || nproc > 1024) return Fail("--nproc must be in [1, 1024]");
  if (nnodes < 1 || nnodes > 65536 || static_cast<int64_t>(nproc) * nnodes > 65536) {
    return Fail("--nnodes must be >= 1 and nproc * nnodes at most 65536");
  }
  if (node_rank < 0 || node_rank >= nnodes) {
    return Fail("--node_rank must be in [0, --nnodes)");
  }
  if (absl::GetFlag(FLAGS_max_restarts) < 0) return Fail("--max_restarts must be >= 0");
  const int64_t collective_timeout_s = absl::GetFlag(FLAGS_collective_timeout_s);
  if (collective_timeout_s < 1 || collective_timeout_s > 86400) {
    return Fail("--collective_timeout_s must be in [1, 86400]");
  }
  if (absl::GetFlag(FLAGS_blas_threads) < 0 || absl::GetFlag(FLAGS_blas_threads) > 1024) {
    return Fail("--blas_threads must be in [0, 1024] (0 = cores per rank)");
  }
  const int ckpt_thread_nice = absl::GetFlag(FLAGS_ckpt_thread_nice);
  if (ckpt_thread_nice < 0 || ckpt_thread_nice > 19) {
    return Fail("--ckpt_thread_nice must be in [0, 19] (0 = as the training threads)");
  }
  // The hyper-parameters as given (double), before TrainOptions narrows them to float.
  const double lr = absl::GetFlag(FLAGS_lr);
  if (!(std::isfinite(lr) && lr > 0 && lr <= 1)) return Fail("--lr must be a number in (0, 1]");
  const double min_lr_ratio = absl::GetFlag(FLAGS_min_lr_ratio);
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) {
    return Fail("--min_lr_ratio must be a number in [0, 1]");
  }
  const double grad_clip = absl::GetFlag(FLAGS_grad_clip);
  if (!(std::isfinite(grad_clip) && grad_clip >= 0)) {
    return Fail("--grad_clip must be a number >= 0 (0 = off)");
  }
  const double weight_decay = absl::GetFlag(FLAGS_weight_decay);
  if (!(std::isfinite(weight_decay) && weight_decay >= 0 && weight_decay <= 1)) {
    return Fail("--weight_decay must be a number in [0, 1]");
  }
  if (o.warmup_steps < -1) return Fail("--warmup must be >= 0, or -1 for steps/10");
  if (o.fail_at_step < -1) return Fail("--fail_at_step must be a step >= 0, or -1 (off)");
  if (o.test_freeze_at_step < -1) {
    return Fail("--test_freeze_at_step must be a step >= 0, or -1 (off)");
  }
  if (o.test_freeze_before != "reduction" && o.test_freeze_before != "allgather") {
    return Fail("--test_freeze_before must be reduction or allgather");
  }
  if (o.seq_len < 0) return Fail("--seq must be >= 0 (0 = the model's context)");
  if (o.ckpt.every < 0) return Fail("--ckpt_every must be >= 0");
  if (o.ckpt.gockpt_window < 0) return Fail("--gockpt_window must be >= 0");
  if (o.ckpt.persist_timeout_ms < 0) return Fail("--ckpt_persist_timeout_ms must be >= 0");
  if ((o.fail_at_step >= 0 || o.test_freeze_at_step >= 0) &&
      (o.fail_rank < 0 || o.fail_rank >= nproc * nnodes)) {
    return Fail("--fail_rank must be a rank of the job");
  }
  if (absl::Status s = gradsnap::ValidateName(o.ckpt.job, "--job"); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  for (const std::string& e : o.storage) {
    const size_t colon = e.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == e.size() ||
        e.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return Fail("--storage endpoint '" + e + "' is not HOST:PORT");
    }
  }
  if (o.replicas < 1 || o.replicas > 16 || o.cluster_replicas < 1 || o.cluster_replicas > 16) {
    return Fail("--replicas must be in [1, 16]");
  }
  if (o.replicas > 1 && o.replicas > static_cast<int>(o.storage.size())) {
    return Fail(o.storage.empty()
                    ? "--replicas applies to --storage endpoints only"
                    : absl::StrCat("--replicas ", o.replicas, " needs at least as many --storage "
                                   "endpoints (", o.storage.size(), " given)"));
  }
  if (std::string p = CheckHostname(o.hostname); !p.empty()) return Fail(p);
  if (nnodes > 1 && absl::GetFlag(FLAGS_rdzv).empty()) {
    return Fail("--rdzv DIR (shared by all nodes) is required when --nnodes > 1");
  }
  if (o.steps < 1) return Fail("--steps must be at least 1");
  auto config = t::ModelConfigByName(o.model);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  // --device cuda|sim: this node's ranks use devices device_id .. device_id + nproc - 1.
  if (absl::Status s = gradsnap::gpu_snapshot::CheckDeviceFlags(nproc); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  const int world = nproc * nnodes;
  if (o.global_batch < 1 || o.global_batch % world != 0) {
    return Fail("--batch must be a positive multiple of the world size (nproc * nnodes)");
  }
  const int seq = o.seq_len > 0 ? o.seq_len : config->max_seq_len;
  if (seq > config->max_seq_len) return Fail("--seq exceeds the model's context length");
  auto corpus = t::LoadCorpus(o.data, seq);
  if (!corpus.ok()) return Fail(std::string(corpus.status().message()));
  if (o.ckpt.mode != gradsnap::gpu_snapshot::SnapshotMode::kNone && o.ckpt.every <= 0) {
    return Fail(std::string("--ckpt_mode ") + gradsnap::gpu_snapshot::SnapshotModeName(o.ckpt.mode) +
                " needs --ckpt_every N > 0");
  }
  if (o.ckpt.mode == gradsnap::gpu_snapshot::SnapshotMode::kNone && o.ckpt.grad_log &&
      o.resume.kind == t::ResumeKind::kNone) {
    // Its DELTAs would have no FULL to extend: the run would write nothing it could resume.
    return Fail(
        "--grad_log with --ckpt_mode none needs --resume: its DELTA records extend the FULL "
        "checkpoint the run resumes from (give a --ckpt_mode to write FULL checkpoints)");
  }
  if (!o.init_from.empty()) {
    if (o.resume.kind != t::ResumeKind::kNone) return Fail("give --init_from DIR or --resume, not both");
    // Every tensor checked once here, so a damaged directory is refused before any rank starts.
    auto dir = gradsnap::recovery::OpenDirSource(o.init_from, /*verify_all=*/true);
    if (!dir.ok()) return Fail("--init_from: " + std::string(dir.status().message()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gradsnap::TuneMallocForStreaming(/*few_arenas=*/false);  // checkpoints stream gigabytes
  gradsnap::CommandLine command_line(  // --ckpt-mode is --ckpt_mode
      argc, argv,
      "gradsnap-train --data FILE --model NAME --steps N [--nproc P] "
      "[--device cpu|cuda|sim] [--device_id I] [--sim_copy_gbps X] "
      "[--ckpt_mode none|sync|async|gockpt] [--ckpt_every N] [--grad_log] [--gockpt_window K] "
      "[--ckpt_dir DIR | --storage H:P[,H:P...] [--replicas R] | --etcd H:P[,H:P...] "
      "[--replicas R] [--min-replicas W] [--etcd-ca F] [--etcd-cert F --etcd-key F] "
      "[--etcd-user U [--etcd-password-file F]]] "
      "[--resume none|latest|STEP | --init_from DIR] "
      "[--fail_at_step S --fail_rank R] [--max_restarts N] [--trace FILE]\n"
      "See docs/trainer.md and docs/gockpt.md.",
      {"train_main", "device_flags", "etcd_flags"});
  // One line and exit 2 for a bad flag (docs/trainer.md), before anything starts.
  std::vector<char*> positional = command_line.Parse(kExitNoRestart);
  if (positional.size() > 1) return Fail(std::string("unexpected argument: ") + positional[1]);
  bool replicas_given = false;
  for (const char* arg : command_line.args()) {
    const std::string a = arg == nullptr ? "" : arg;  // flag names are underscored by now
    replicas_given |= a == "--replicas" || a.rfind("--replicas=", 0) == 0;
  }
  absl::StatusOr<gradsnap::trainer::TrainOptions> options = OptionsFromFlags(replicas_given);
  if (!options.ok()) return Fail(std::string(options.status().message()));
  const gradsnap::trainer::TrainOptions o = *std::move(options);

  if (o.rank >= 0) {  // one rank
    // A rank dies with its launcher (no zombie keeps writing), also if the launcher died
    // before this line ran.
    const int launcher = absl::GetFlag(FLAGS_launcher_pid);
    if (!absl::GetFlag(FLAGS_test_ignore_parent_death)) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (launcher > 0 && getppid() != launcher) return Fail("the launcher is gone");
    }
    if (o.world_size < 1 || o.world_size > 65536 || o.rank >= o.world_size) {
      return Fail("--rank must be in [0, --world_size) and --world_size in [1, 65536]");
    }
    if (o.world_size > 1 && o.rdzv_dir.empty()) return Fail("--rdzv_dir is required");
    gradsnap::SetBackgroundNice(absl::GetFlag(FLAGS_ckpt_thread_nice));  // checked by the launcher
    if (o.world_size > 1) {
      if (std::string p = CheckHostname(o.hostname); !p.empty()) return Fail(p);
    }
    auto permanent = [](const absl::Status& s) {
      return absl::IsInvalidArgument(s) || absl::IsNotFound(s) || absl::IsFailedPrecondition(s) ||
             absl::IsUnimplemented(s) || absl::IsAlreadyExists(s) ||
             absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s);
    };
    auto report = [&o](const absl::Status& s) {
      std::fprintf(stderr, "gradsnap-train: rank %d: %s\n", o.rank, s.ToString().c_str());
    };
    // A failed attempt (a peer gone, a collective broken) is restarted whole by the launcher,
    // which learns of it when the first rank exits: this rank exits at once, without tearing
    // down its store client, checkpointer and collectives (tens to hundreds of milliseconds,
    // more with a peer gone). Nothing is lost by it: what the attempt had not committed is
    // rolled back by the next, as after a SIGKILL (docs/trainer.md, "Launcher and failures").
    const absl::Status s = gradsnap::trainer::RunRank(o, [&](const absl::Status& failed) {
      if (permanent(failed)) return;
      report(failed);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    });
    if (s.ok()) return 0;
    report(s);
    return permanent(s) ? kExitNoRestart : 1;
  }

  gradsnap::trainer::LaunchOptions lo;
  lo.nproc = absl::GetFlag(FLAGS_nproc);
  lo.nnodes = absl::GetFlag(FLAGS_nnodes);
  lo.node_rank = absl::GetFlag(FLAGS_node_rank);
  lo.rdzv = absl::GetFlag(FLAGS_rdzv);
  lo.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  lo.resume_on_restart = o.ckpt.writes();
  // What a failed attempt left PENDING is rolled back by the next attempt's rank 0 once it has
  // fenced the failed one off (RankRunner::TakeEpoch), not here: a rollback by the launcher
  // came before that fence, so it was the weaker of the two, and it cost every restart a
  // connection and a listing of the job's checkpoints (about 30 ms in chaos_drill) before the
  // new attempt could start.
  if (int rc = Validate(o, lo.nproc, lo.nnodes, lo.node_rank); rc != 0) return rc;
  // A store that refuses this job for good (no or a wrong token, a bad directory) stops it here,
  // once, instead of in every rank of every attempt.
  if (absl::Status s = gradsnap::trainer::CheckStoreAccess(o); !s.ok()) {
    return Fail(s.ToString());
  }
  const std::vector<char*>& args = command_line.args();
  lo.rank_args.assign(args.begin() + 1, args.end());
  return gradsnap::trainer::Launch(lo);
}
