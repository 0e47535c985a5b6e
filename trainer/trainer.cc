// One rank of a training job; see trainer.h.
#include "trainer/trainer.h"

#include <cblas.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/deadline_wait.h"
#include "common/logging.h"
#include "common/retry.h"
#include "common/sha256.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/checkpointer_factory.h"
#include "trainer/data.h"
#include "trainer/full_shard.h"
#include "trainer/grad_log_store.h"
#include "trainer/model_layout.h"
#include "trainer/resume.h"
#include "trainer/persist_guard.h"
#include "trainer/shard_store.h"
#include "trainer/sim_backend.h"

namespace gradsnap {
namespace trainer {

using gpu_snapshot::SnapshotMode;

absl::StatusOr<ResumeFrom> ParseResume(absl::string_view text) {
  ResumeFrom r;
  if (text == "none") return r;
  if (text == "latest") {
    r.kind = ResumeKind::kLatest;
    return r;
  }
  if (!text.empty() && text.find_first_not_of("0123456789") == absl::string_view::npos &&
      absl::SimpleAtoi(text, &r.step)) {
    r.kind = ResumeKind::kStep;
    return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--resume must be none, latest or a step number, not '", text, "'"));
}

namespace {

// Aborts every PENDING checkpoint of `job` (with `epoch`, 0 for none); returns how many.
absl::StatusOr<int> AbortPending(client::Client& c, const std::string& job, uint64_t epoch) {
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> all, c.List(job, /*include_pending=*/true));
  int removed = 0;
  for (const client::CheckpointInfo& info : all) {
    if (info.state != client::CheckpointState::kPending) continue;
    absl::Status s = c.AbortCheckpoint(job, info.step, epoch);
    // A PENDING DELTA is aborted together with its PENDING base FULL (listed before it).
    if (absl::IsNotFound(s) && info.kind == client::CheckpointKind::kDelta) continue;
    RETURN_IF_ERROR(s);
    ++removed;
  }
  return removed;
}

client::ClientOptions StoreClientOptions(const TrainOptions& o) {
  client::ClientOptions co;
  co.endpoints = o.storage;
  co.etcd = o.etcd;
  co.etcd_tls = o.etcd_tls;
  co.etcd_user = o.etcd_user;
  co.etcd_password = o.etcd_password;
  co.min_replicas = o.min_replicas;
  co.local_dir = o.RemoteStore() ? "" : o.ckpt_dir;
  // The first checkpoint's record buffers are faulted in before the first step, not in it.
  co.prefault_writers = 1;
  co.token = o.token;
  co.replicas = o.replicas;
  co.cluster_replicas = o.cluster_replicas;
  // Each store call gives up after a few quick retries; the persist policy
  // (persist_guard.h) tries each persist once and backs off across checkpoints.
  co.max_attempts = 4;
  co.rpc_timeout_ms = 5000;
  return co;
}

// The embedded engine's directory is locked by one process (RocksDB LOCK, an fcntl lock the
// kernel drops when its owner dies). A rank of the previous attempt may still be dying when this
// one starts: wait for the lock a bounded time (kLockWaitMs, polled every kLockPollMs) instead
// of failing. The last poll may start up to kLockWaitMs after the first (the deadline of
// RetryWhile counts to the end of a wait, hence the extra poll).
constexpr int64_t kLockWaitMs = 10000;
constexpr int64_t kLockPollMs = 100;

absl::StatusOr<std::unique_ptr<client::Client>> ConnectStore(const client::ClientOptions& co) {
  const auto locked = [&co](const absl::Status& s) {
    return !co.local_dir.empty() && absl::IsFailedPrecondition(s) &&
           s.message().find("another process") != absl::string_view::npos;
  };
  return RetryWhile([&co] { return client::Client::Connect(co); }, locked,
                    RetryPolicy{kLockWaitMs + kLockPollMs, kLockPollMs, kLockPollMs});
}

absl::StatusOr<std::unique_ptr<ShardStore>> OpenStore(const TrainOptions& o) {
  const client::ClientOptions co = StoreClientOptions(o);
  std::unique_ptr<Comm> comm;
  if (o.world_size > 1) {
    // The store's own group: the funnel protocol, or the ranks' agreement on persist outcomes.
    GlooOptions g{o.rank, o.world_size, o.rdzv_dir, "ckpt", o.hostname};
    // Through servers each rank persists on its own and then they agree: one may arrive late
    // by its persist (a store call's retries and deadlines; a margin of the flag's too), so
    // its group waits that much longer than the training group for a frozen peer. Embedded,
    // rank 0 writes every rank's shard while the others wait, for as long as the disk takes:
    // that group keeps the rendezvous' 300 s (or the flag, where longer).
    g.op_timeout = std::chrono::milliseconds(
        o.RemoteStore()
            ? o.collective_timeout_ms + std::min<int64_t>(o.ckpt.persist_timeout_ms, 86400000) +
                  4 * co.rpc_timeout_ms
            : std::max<int64_t>(o.collective_timeout_ms, 300000));
    ASSIGN_OR_RETURN(comm, NewGlooComm(g));
  }
  if (o.RemoteStore() || o.world_size == 1) {
    ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, ConnectStore(co));
    return NewDirectShardStore(std::move(c), std::move(comm));
  }
  std::unique_ptr<client::Client> c;
  if (o.rank == 0) {
    ASSIGN_OR_RETURN(c, ConnectStore(co));
  }
  return NewFunnelShardStore(std::move(c), std::move(comm));
}

ReplicatedState InitialState(const TrainOptions& o, const ModelConfig& config,
                             const Corpus& corpus, int seq_len) {
  ReplicatedState s;
  s.seed = o.seed;
  s.loader.seed = SplitMix64(o.seed ^ 0xda7aull);
  s.max_lr = o.lr;
  s.min_lr = o.lr * o.min_lr_ratio;
  s.warmup_steps = o.warmup_steps >= 0 ? o.warmup_steps : o.steps / 10;
  s.total_steps = o.steps;
  s.grad_clip = o.grad_clip;
  s.adamw.weight_decay = o.weight_decay;
  s.model_config = ModelConfigString(config);
  s.world_size = o.world_size;
  s.global_batch = o.global_batch;
  s.seq_len = seq_len;
  s.data_fingerprint = corpus.fingerprint;
  s.param_layout = ModelLayoutText(config);
  return s;
}

class RankRunner {
 public:
  explicit RankRunner(const TrainOptions& o) : o_(o) {}
  absl::Status Run();
  // The trace of a failed attempt, written before its rank exits without tearing down.
  void FlushDiagnostics() {
    if (ckpt_ == nullptr) return;
    absl::Status s = ckpt_->FlushDiagnostics();
    if (!s.ok()) GS_LOG(WARNING) << "trace: " << s;
  }

 private:
  absl::Status RunSteps();
  absl::Status Setup();
  absl::Status TakeEpoch();  // end of Setup
  absl::Status Resume();
  absl::Status Step(int64_t s);
  // The freeze drill (--test_freeze_at_step): whether it stops this rank in step s before
  // `before`; Freeze SIGSTOPs it.
  bool FreezeDrillAt(int64_t s, absl::string_view before) const;
  absl::Status Freeze(int64_t s);
  absl::Status Timed(double* stall_ms, const absl::Status& s, const Stopwatch& sw);
  // The failure drill's --test_fail_after_commit: waits until the job lists a committed
  // checkpoint, so the restart must restore one.
  absl::Status WaitForCommittedCheckpoint();
  absl::Status Summary();
  void PrintRecoveryTime();

  const TrainOptions& o_;
  ModelConfig config_;
  int seq_len_ = 0;
  Corpus corpus_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Comm> device_comm_;  // sim: the device's collectives (outlives backend_)
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<DataLoader> loader_;
  ReplicatedState state_;
  std::vector<int32_t> inputs_, targets_;
  int64_t resumed_from_ = -1;
  ResumeOutcome resume_;
  int64_t setup_done_ms_ = 0;
  int64_t steps_run_ = 0;
  double total_ms_ = 0, total_stall_ms_ = 0;
};

absl::Status RankRunner::Setup() {
  openblas_set_num_threads(o_.blas_threads);
  ASSIGN_OR_RETURN(config_, ModelConfigByName(o_.model));
  seq_len_ = o_.seq_len > 0 ? o_.seq_len : config_.max_seq_len;
  if (seq_len_ > config_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("--seq ", seq_len_, " exceeds the ", o_.model,
                                                   " model's ", config_.max_seq_len));
  }
  if (o_.global_batch < 1 || o_.global_batch % o_.world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch ", o_.global_batch, " must be a positive multiple of the world size ",
        o_.world_size));
  }
  ASSIGN_OR_RETURN(corpus_, LoadCorpus(o_.data, seq_len_));
  if (o_.world_size == 1) {
    comm_ = NewLocalComm();
  } else {
    GlooOptions g{o_.rank, o_.world_size, o_.rdzv_dir, "train", o_.hostname};
    g.op_timeout = std::chrono::milliseconds(o_.collective_timeout_ms);
    ASSIGN_OR_RETURN(comm_, NewGlooComm(g));
  }
  // --init-from alone needs no store.
  if (o_.ckpt.mode != SnapshotMode::kNone || o_.resume.kind != ResumeKind::kNone) {
    ASSIGN_OR_RETURN(store_, OpenStore(o_));
  }
  const int local_batch = o_.global_batch / o_.world_size;
  // The rank's device: its local index on the node, offset by --device_id (docs/trainer.md).
  const int ordinal = o_.device_id + o_.local_rank;
  const std::chrono::milliseconds collective_timeout(o_.collective_timeout_ms);
  if (o_.device == DeviceKind::kCpu) {
    backend_ = NewCpuBackend(config_, local_batch, seq_len_, comm_.get(), o_.blas_threads);
  } else if (o_.device == DeviceKind::kSim) {
    // The simulated device's collective library (NCCL's part on CUDA): a group of its own
    // without a limit of its own; the back end's deadline bounds its waits and aborts it.
    Comm* kernels = comm_.get();
    if (o_.world_size > 1) {
      GlooOptions g{o_.rank, o_.world_size, o_.rdzv_dir, "device", o_.hostname};
      g.op_timeout = std::chrono::milliseconds(0);
      ASSIGN_OR_RETURN(device_comm_, NewGlooComm(g));
      kernels = device_comm_.get();
    }
    ASSIGN_OR_RETURN(backend_, NewSimBackend(config_, local_batch, seq_len_, kernels, ordinal,
                                             o_.sim, collective_timeout));
  } else {
    ASSIGN_OR_RETURN(backend_, NewCudaBackend(config_, local_batch, seq_len_, comm_.get(),
                                              ordinal, collective_timeout));
  }
  state_ = InitialState(o_, config_, corpus_, seq_len_);
  std::vector<float> init(ParamLayout(config_).total());
  InitParams(config_, o_.seed, init.data());
  RETURN_IF_ERROR(backend_->SetParams(init.data()));
  loader_ = std::make_unique<DataLoader>(&corpus_, seq_len_, o_.global_batch, o_.rank,
                                         o_.world_size);
  inputs_.resize(static_cast<size_t>(local_batch) * seq_len_);
  targets_.resize(inputs_.size());
  return TakeEpoch();
}

absl::Status RankRunner::TakeEpoch() {
  // One writer per job: an attempt that writes takes a new epoch (rank 0), every rank writes
  // with it, and the store refuses the writes of every older attempt (docs/protocol.md,
  // "Epochs"). Taking it fences out the job's running attempt, so it is taken only by a launch
  // that will write (checkpointing on) and only once rank 0's checks have not refused it
  // (CheckBeforeFencing): a refused launch, or one that only reads, leaves the running one be.
  if (store_ == nullptr || !o_.ckpt.writes()) return absl::OkStatus();
  double epoch = 0;
  absl::Status refused;
  if (o_.rank == 0) {
    refused = CheckBeforeFencing(o_, store_.get(), backend_->View(), state_);
    if (refused.ok()) {
      ASSIGN_OR_RETURN(uint64_t e, store_->AcquireEpoch(o_.ckpt.job));
      epoch = static_cast<double>(e);
      // Every older attempt is fenced off now, so a PENDING checkpoint is one of theirs (its
      // launcher killed before it rolled them back): left, it would refuse this attempt's
      // checkpoint of the same step with another spec (ALREADY_EXISTS, a cut chain).
      if (client::Client* c = store_->client(); c != nullptr) {
        absl::StatusOr<int> n = AbortPending(*c, o_.ckpt.job, e);
        if (!n.ok()) {
          GS_LOG(WARNING) << "rolling back the pending checkpoints of an earlier attempt: "
                          << n.status();
        } else if (*n > 0) {
          std::printf("rolled back %d pending checkpoint(s) of an earlier attempt\n", *n);
          std::fflush(stdout);
        }
      }
    } else {
      // -1: refused for good (no restart); -2: the store could not be asked (restartable).
      epoch = absl::IsFailedPrecondition(refused) ? -1 : -2;
    }
  }
  RETURN_IF_ERROR(comm_->AllReduceSum(&epoch, 1));
  if (epoch < 0) {
    if (!refused.ok()) return refused;
    if (epoch == -1) {
      return absl::FailedPreconditionError("rank 0 refused this launch (its message says why)");
    }
    return absl::UnavailableError("rank 0 could not check the store (its message says why)");
  }
  store_->SetEpoch(static_cast<uint64_t>(epoch));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckStoreAccess(const TrainOptions& o) {
  if (!o.ckpt.writes() && o.resume.kind == ResumeKind::kNone) {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<client::Client>> c = ConnectStore(StoreClientOptions(o));
  absl::Status s = c.status();
  if (c.ok()) s = (*c)->List(o.ckpt.job).status();
  if (IsPermanentStoreError(s) && !IsSuperseded(s)) return s;
  return absl::OkStatus();
}

namespace {

// A resumed run continues the checkpoint's optimization exactly: its schedule, clipping, AdamW
// settings and seed are kept, whatever this run's flags say. Where they differ, one line says
// so (they were silently dropped before).
void NoteKeptHyperparameters(const ReplicatedState& run, const ReplicatedState& kept) {
  std::vector<std::string> diffs;
  auto note = [&](const char* flag, auto mine, auto theirs) {
    if (mine != theirs) diffs.push_back(absl::StrCat(flag, " ", theirs, " (this run: ", mine, ")"));
  };
  note("--lr", run.max_lr, kept.max_lr);
  note("min lr", run.min_lr, kept.min_lr);
  note("--warmup", run.warmup_steps, kept.warmup_steps);
  note("LR horizon (--steps)", run.total_steps, kept.total_steps);
  note("--grad-clip", run.grad_clip, kept.grad_clip);
  note("--weight-decay", run.adamw.weight_decay, kept.adamw.weight_decay);
  note("--seed", run.seed, kept.seed);
  if (diffs.empty()) return;
  std::printf("resume keeps the checkpoint's hyper-parameters: %s\n",
              absl::StrJoin(diffs, ", ").c_str());
  std::fflush(stdout);
}

absl::Status RankRunner::Resume() {
  if (store_ != nullptr && o_.resume.kind == ResumeKind::kNone) {
    // A fresh run (or one started from --init-from) must not collide with a job's checkpoints.
    ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> existing,
                     store_->ListCommitted(o_.ckpt.job));
    RETURN_IF_ERROR(RefuseFreshRunOfExistingJob(o_.ckpt.job, existing));
  }
  if (o_.resume.kind == ResumeKind::kNone && o_.init_from.empty()) return absl::OkStatus();
  // Any world size: each rank restores its own slice (resume.h).
  const TrainStateView view = backend_->View();
  std::vector<float> master(view.count()), m(view.count()), v(view.count());
  ASSIGN_OR_RETURN(ResumeOutcome r, RestoreRankState(o_, store_.get(), *comm_, view, state_,
                                                     master.data(), m.data(), v.data()));
  if (!r.resumed) return absl::OkStatus();
  RETURN_IF_ERROR(backend_->SliceFromHost(master.data(), m.data(), v.data()));
  if (o_.rank == 0) NoteKeptHyperparameters(state_, r.state);
  state_ = r.state;
  resumed_from_ = state_.step;
  resume_ = r;
  if (o_.rank == 0) {
    std::printf(
        "resumed job %s from step %lld (%s: full %lld + %d delta(s), written by %d rank(s))\n",
        o_.ckpt.job.c_str(), static_cast<long long>(state_.step), r.source.c_str(),
        static_cast<long long>(r.full_step), r.deltas, r.saved_world_size);
    if (state_.step < r.newest_step || !r.damage.empty()) {
      std::printf("recovery point fell back from step %lld to step %lld: %lld step(s) lost "
                  "(%s)\n",
                  static_cast<long long>(r.newest_step), static_cast<long long>(state_.step),
                  static_cast<long long>(r.newest_step - state_.step),
                  r.damage.empty() ? "a damaged record on another rank"
                                   : absl::StrCat("damaged: ", r.damage.front()).c_str());
    }
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status RankRunner::WaitForCommittedCheckpoint() {
  const bool direct = o_.RemoteStore() || o_.world_size == 1;  // listing is not collective
  if (store_ == nullptr || !direct) {
    return absl::InvalidArgumentError(
        "--test_fail_after_commit needs checkpointing and one rank (or --storage)");
  }
  for (int i = 0; i < 6000; ++i) {
    ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list,
                     store_->ListCommitted(o_.ckpt.job));
    if (!list.empty()) return absl::OkStatus();
    usleep(10000);
  }
  return absl::DeadlineExceededError("--test_fail_after_commit: no checkpoint committed in 60 s");
}

// After a restart (the launcher passes when it saw the failure and started this attempt): the
// time from the failure to the first resumed step, split into its phases.
void RankRunner::PrintRecoveryTime() {
  if (o_.rank != 0 || o_.recovery_failed_at_ms < 0 || o_.recovery_spawned_at_ms < 0) return;
  const int64_t now = UnixMillis();
  const double detection =
      static_cast<double>(o_.recovery_spawned_at_ms - o_.recovery_failed_at_ms);
  const double start = static_cast<double>(setup_done_ms_ - o_.recovery_spawned_at_ms);
  const double total = static_cast<double>(now - o_.recovery_failed_at_ms);
  std::printf(
      "recovery failure_to_first_step_ms=%.0f detection_ms=%.0f process_start_ms=%.0f "
      "list_ms=%.1f fetch_ms=%.1f replay_ms=%.1f other_ms=%.1f\n",
      total, detection, start, resume_.list_ms, resume_.fetch_ms, resume_.replay_ms,
      std::max(0.0, total - detection - start - resume_.list_ms - resume_.fetch_ms -
                        resume_.replay_ms));
  std::fflush(stdout);
}

absl::Status RankRunner::Timed(double* stall_ms, const absl::Status& s, const Stopwatch& sw) {
  // On a device, only the part of the hook during which the device had run out of queued work
  // stalled training (backend.h).
  *stall_ms += backend_->StalledMillis(sw.ElapsedMillis());
  return s;
}

bool RankRunner::FreezeDrillAt(int64_t s, absl::string_view before) const {
  return o_.attempt == 0 && s == o_.test_freeze_at_step && o_.rank == o_.fail_rank &&
         o_.test_freeze_before == before;
}

absl::Status RankRunner::Freeze(int64_t s) {
  // Frozen mid-step, its sockets open, once its device ran the work queued so far: the others
  // wait for its share of the next collective (the reduction, or the all-gather) until their
  // collective deadline.
  const TrainStateView v = backend_->View();
  std::vector<float> master(v.count()), m(v.count()), var(v.count());
  RETURN_IF_ERROR(backend_->SliceToHost(master.data(), m.data(), var.data()));
  std::fflush(stdout);
  GS_LOG(WARNING) << "freeze drill: rank " << o_.rank << " stops itself at step " << s
                  << " before its " << o_.test_freeze_before;
  raise(SIGSTOP);
  return absl::OkStatus();
}

absl::Status RankRunner::Step(int64_t s) {
  if (o_.attempt == 0 && s == o_.fail_at_step && o_.rank == o_.fail_rank) {
    if (o_.test_fail_after_commit) RETURN_IF_ERROR(WaitForCommittedCheckpoint());
    std::fflush(stdout);
    GS_LOG(WARNING) << "failure drill: rank " << o_.rank << " kills itself at step " << s;
    raise(SIGKILL);
  }
  if (o_.test_step_delay_ms > 0) usleep(static_cast<useconds_t>(o_.test_step_delay_ms) * 1000);
  Stopwatch step_sw;
  double stall = 0;
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&stall, ckpt_->BeforeStep(s), sw));
  }
  loader_->Batch(state_.loader, inputs_.data(), targets_.data());
  const double tokens = static_cast<double>(o_.global_batch) * seq_len_;
  // The hook right before the gradients of step s-1 are overwritten (checkpointer.h): the
  // backward on the CPU, the reduction on a device (its separate reduced-gradient buffer).
  auto before_grad_overwrite = [&]() -> absl::Status {
    Stopwatch sw;
    return Timed(&stall, ckpt_->BeforeGradOverwrite(s), sw);
  };
  const bool reduce_overwrites = backend_->ReduceOverwritesGrads();
  if (!reduce_overwrites) RETURN_IF_ERROR(before_grad_overwrite());
  RETURN_IF_ERROR(backend_->ForwardBackward(inputs_.data(), targets_.data(),
                                            static_cast<float>(1.0 / tokens)));
  if (FreezeDrillAt(s, "reduction")) RETURN_IF_ERROR(Freeze(s));
  if (reduce_overwrites) RETURN_IF_ERROR(before_grad_overwrite());
  ASSIGN_OR_RETURN(Backend::Sums reduced, backend_->ReduceGrads());
  double sums[2] = {reduced.loss_sum, reduced.grad_sq};
  RETURN_IF_ERROR(comm_->AllReduceSum(sums, 2));
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&stall, ckpt_->AfterBackward(s, backend_->Grads()), sw));
  }
  const double norm = std::sqrt(sums[1]);
  UpdateInfo info;
  info.skipped = !std::isfinite(norm) || s == o_.test_skip_step;
  info.grad_norm = static_cast<float>(norm);
  const float lr = LearningRate(state_, s);
  const float scale = (state_.grad_clip > 0 && norm > state_.grad_clip)
                          ? static_cast<float>(state_.grad_clip / norm)
                          : 1.0f;
  info.opt_t = state_.opt_t + (info.skipped ? 0 : 1);
  info.params = MakeAdamWStepParams(state_.adamw, lr, scale, info.opt_t);
  {
    // The update of the block whose checkpoint copy may still be running waits for that copy
    // alone; the rest of the slice is updated meanwhile (checkpointer.h).
    const gpu_snapshot::ElemRange held = ckpt_->BlockInFlight();
    const size_t n = backend_->View().count();
    if (!info.skipped && !held.empty()) {
      RETURN_IF_ERROR(backend_->UpdateRange(info.params, 0, held.begin));
      RETURN_IF_ERROR(backend_->UpdateRange(info.params, held.end, n));
    }
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&stall, ckpt_->BeforeBlockUpdate(s), sw));
    if (!info.skipped) {
      RETURN_IF_ERROR(held.empty() ? backend_->UpdateRange(info.params, 0, n)
                                   : backend_->UpdateRange(info.params, held.begin, held.end));
    }
  }
  state_.step = s;
  state_.opt_t = info.opt_t;
  state_.skipped_steps += info.skipped ? 1 : 0;
  state_.loader.batch_index += 1;
  info.loader = state_.loader;
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&stall, ckpt_->AfterUpdate(s, info), sw));
  }
  if (FreezeDrillAt(s, "allgather")) RETURN_IF_ERROR(Freeze(s));
  RETURN_IF_ERROR(backend_->GatherParams());
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&stall, ckpt_->EndStep(s, state_), sw));
  }
  const double step_ms = step_sw.ElapsedMillis();
  total_ms_ += step_ms;
  total_stall_ms_ += stall;
  ++steps_run_;
  if (o_.rank == 0) {
    std::string health;
    if (store_ != nullptr && o_.ckpt.mode != SnapshotMode::kNone) {
      const CheckpointHealth h = ckpt_->Health();
      health = absl::StrFormat(
          " ckpt_failures %d ckpt_skipped %d recovery_point %d recovery_age_s %.1f", h.failures,
          h.skipped + h.untried, h.recovery_point, h.recovery_age_s);
    }
    std::printf("step %lld loss %.6f step_ms %.1f stall_ms %.1f%s%s\n",
                static_cast<long long>(s), sums[0] / tokens, step_ms, stall,
                info.skipped ? " skipped" : "", health.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status RankRunner::Summary() {
  std::vector<float> params;
  RETURN_IF_ERROR(backend_->FullMasterParams(&params));
  if (o_.rank != 0) return absl::OkStatus();
  const std::string sha = Sha256Hex(params.data(), params.size() * sizeof(float));
  const double tokens = static_cast<double>(steps_run_) * o_.global_batch * seq_len_;
  const CheckpointHealth h = ckpt_->Health();
  std::printf(
      "summary model=%s nproc=%d step=%lld steps_run=%lld tokens=%.0f tokens_per_s=%.1f "
      "mean_step_ms=%.1f stall_ms_total=%.1f resumed_from=%lld ckpt_failures=%lld "
      "ckpt_skipped=%lld recovery_point=%lld recovery_age_s=%.1f params=%zu params_sha256=%s\n",
      o_.model.c_str(), o_.world_size, static_cast<long long>(state_.step),
      static_cast<long long>(steps_run_), tokens,
      total_ms_ > 0 ? tokens / (total_ms_ / 1000.0) : 0.0,
      steps_run_ > 0 ? total_ms_ / steps_run_ : 0.0, total_stall_ms_,
      static_cast<long long>(resumed_from_), static_cast<long long>(h.failures),
      static_cast<long long>(h.skipped + h.untried), static_cast<long long>(h.recovery_point), h.recovery_age_s, params.size(), sha.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status RankRunner::Run() {
  const absl::Status s = RunSteps();
  // A frozen peer (the device's group or NCCL is aborted already): the persist thread may be
  // waiting for it in the store's group too, and the rank's teardown would wait with it.
  if (IsCollectiveDeadline(s) && store_ != nullptr) store_->AbortGroup();
  return s;
}

absl::Status RankRunner::RunSteps() {
  RETURN_IF_ERROR(Setup());
  setup_done_ms_ = UnixMillis();
  RETURN_IF_ERROR(Resume());
  CheckpointerOptions ckpt = o_.ckpt;
  if (o_.device != DeviceKind::kCpu && o_.world_size > 1) {
    // A snapshot copy queued after a collective that a frozen peer never joins waits for ever
    // unless its wait has the collectives' deadline too (snapshot_engine.h).
    ckpt.copy_stall_timeout = std::chrono::milliseconds(o_.collective_timeout_ms);
    ckpt.abort_collectives = [b = backend_.get()] { return b->AbortCollectives(); };
  }
  ASSIGN_OR_RETURN(ckpt_, MakeCheckpointer(ckpt, backend_->View(), store_.get()));
  RETURN_IF_ERROR(ckpt_->Start(state_));
  const int64_t first = state_.step + 1;  // state_.step advances with every step
  for (int64_t s = first; s <= o_.steps; ++s) {
    if (s == first && resumed_from_ >= 0) PrintRecoveryTime();
    RETURN_IF_ERROR(Step(s));
  }
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&total_stall_ms_, ckpt_->Finish(), sw));
  }
  return Summary();
}

}  // namespace

absl::Status RunRank(const TrainOptions& options,
                     const std::function<void(const absl::Status&)>& before_teardown) {
  RankRunner runner(options);
  absl::Status s = runner.Run();
  if (!s.ok() && before_teardown) {
    runner.FlushDiagnostics();
    before_teardown(s);
  }
  return s;
}

}  // namespace trainer
}  // namespace gradsnap
