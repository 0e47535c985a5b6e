// One rank of a training job; see trainer.h.
#include "trainer/trainer.h"

#include <cblas.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/checkpointer_factory.h"
#include "trainer/data.h"
#include "trainer/full_shard.h"
#include "trainer/grad_log_store.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace trainer {
namespace {

client::ClientOptions StoreClientOptions(const TrainOptions& o) {
  client::ClientOptions co;
  co.endpoints = o.storage;
  co.local_dir = o.storage.empty() ? o.ckpt_dir : "";
  co.token = o.token;
  return co;
}

absl::StatusOr<std::unique_ptr<ShardStore>> OpenStore(const TrainOptions& o) {
  const client::ClientOptions co = StoreClientOptions(o);
  if (!o.storage.empty() || o.world_size == 1) {
    ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::Connect(co));
    return NewDirectShardStore(std::move(c));
  }
  GlooOptions g{o.rank, o.world_size, o.rdzv_dir, "ckpt", o.hostname};
  ASSIGN_OR_RETURN(std::unique_ptr<Comm> comm, NewGlooComm(g));
  std::unique_ptr<client::Client> c;
  if (o.rank == 0) {
    ASSIGN_OR_RETURN(c, client::Client::Connect(co));
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
  return s;
}

// A checkpoint may be resumed only by a run of the same shape.
absl::Status CheckCompatible(const ReplicatedState& ckpt, const ReplicatedState& run) {
  auto mismatch = [](const char* what, const auto& a, const auto& b) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint does not match this run: ", what, " is '", a, "' in the checkpoint, '", b,
        "' in this run"));
  };
  if (ckpt.model_config != run.model_config) {
    return mismatch("model", ckpt.model_config, run.model_config);
  }
  if (ckpt.world_size != run.world_size) {
    return mismatch("world size", ckpt.world_size, run.world_size);
  }
  if (ckpt.global_batch != run.global_batch) {
    return mismatch("global batch", ckpt.global_batch, run.global_batch);
  }
  if (ckpt.seq_len != run.seq_len) return mismatch("sequence length", ckpt.seq_len, run.seq_len);
  if (ckpt.data_fingerprint != run.data_fingerprint) {
    return mismatch("data", ckpt.data_fingerprint, run.data_fingerprint);
  }
  return absl::OkStatus();
}

class RankRunner {
 public:
  explicit RankRunner(const TrainOptions& o) : o_(o) {}
  absl::Status Run();

 private:
  absl::Status Setup();
  absl::Status Resume();
  absl::Status Step(int64_t s);
  absl::Status Timed(double* stall_ms, const absl::Status& s, const Stopwatch& sw);
  absl::Status Summary();

  const TrainOptions& o_;
  ModelConfig config_;
  int seq_len_ = 0;
  Corpus corpus_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<DataLoader> loader_;
  ReplicatedState state_;
  std::vector<int32_t> inputs_, targets_;
  int64_t resumed_from_ = -1;
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
    ASSIGN_OR_RETURN(comm_, NewGlooComm(g));
  }
  if (o_.ckpt.mode != "none" || o_.resume != "none") {
    ASSIGN_OR_RETURN(store_, OpenStore(o_));
  }
  const int local_batch = o_.global_batch / o_.world_size;
  if (o_.device == "cpu") {
    backend_ = NewCpuBackend(config_, local_batch, seq_len_, comm_.get());
  } else {
    ASSIGN_OR_RETURN(backend_, NewCudaBackend(config_, local_batch, seq_len_, comm_.get()));
  }
  state_ = InitialState(o_, config_, corpus_, seq_len_);
  std::vector<float> init(ParamLayout(config_).total());
  InitParams(config_, o_.seed, init.data());
  RETURN_IF_ERROR(backend_->SetParams(init.data()));
  loader_ = std::make_unique<DataLoader>(&corpus_, seq_len_, o_.global_batch, o_.rank,
                                         o_.world_size);
  inputs_.resize(static_cast<size_t>(local_batch) * seq_len_);
  targets_.resize(inputs_.size());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> AbandonPendingCheckpoints(const TrainOptions& o) {
  ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c,
                   client::Client::Connect(StoreClientOptions(o)));
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> all,
                   c->List(o.ckpt.job, /*include_pending=*/true));
  int removed = 0;
  for (const client::CheckpointInfo& info : all) {
    if (info.state != client::CheckpointState::kPending) continue;
    RETURN_IF_ERROR(c->AbortCheckpoint(o.ckpt.job, info.step));
    ++removed;
  }
  return removed;
}

namespace {

absl::Status RankRunner::Resume() {
  if (store_ == nullptr) return absl::OkStatus();
  if (o_.resume == "none") {  // a fresh run must not collide with a job's existing checkpoints
    ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> existing,
                     store_->ListCommitted(o_.ckpt.job));
    if (!existing.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", o_.ckpt.job, " already has checkpoints (newest step ", existing.back().step,
          "); pass --resume latest to continue it or --job NAME for a new job"));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(int64_t step, ResolveResumeStep(*store_, o_.ckpt.job, o_.resume));
  if (step < 0) return absl::OkStatus();
  // Refuse a checkpoint of another shape before reading any tensor.
  ASSIGN_OR_RETURN(ReplicatedState saved, ReadCheckpointState(*store_, o_.ckpt.job, step));
  RETURN_IF_ERROR(CheckCompatible(saved, state_));
  const TrainStateView view = backend_->View();
  std::vector<float> master(view.count()), m(view.count()), v(view.count());
  ASSIGN_OR_RETURN(ReplicatedState restored,
                   RestoreFullShard(*store_, o_.ckpt.job, step, view, master.data(), m.data(),
                                    v.data()));
  RETURN_IF_ERROR(CheckCompatible(restored, state_));
  if (o_.resume == "latest") {  // FULL + the gradient log's DELTAs on it (grad_log_store.h)
    ASSIGN_OR_RETURN(restored, ReplayGradLog(*store_, o_.ckpt.job, step, view, master.data(),
                                             m.data(), v.data(), restored));
  }
  RETURN_IF_ERROR(backend_->SliceFromHost(master.data(), m.data(), v.data()));
  state_ = restored;
  step = restored.step;
  resumed_from_ = step;
  if (o_.rank == 0) {
    std::printf("resumed job %s from step %lld\n", o_.ckpt.job.c_str(),
                static_cast<long long>(step));
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status RankRunner::Timed(double* stall_ms, const absl::Status& s, const Stopwatch& sw) {
  *stall_ms += sw.ElapsedMillis();
  return s;
}

absl::Status RankRunner::Step(int64_t s) {
  if (o_.attempt == 0 && s == o_.fail_at_step && o_.rank == o_.fail_rank) {
    std::fflush(stdout);
    GS_LOG(WARNING) << "failure drill: rank " << o_.rank << " kills itself at step " << s;
    raise(SIGKILL);
  }
  Stopwatch step_sw;
  double stall = 0;
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&stall, ckpt_->BeforeStep(s), sw));
  }
  loader_->Batch(state_.loader, inputs_.data(), targets_.data());
  const double tokens = static_cast<double>(o_.global_batch) * seq_len_;
  ASSIGN_OR_RETURN(double loss_sum, backend_->ForwardBackward(inputs_.data(), targets_.data(),
                                                              static_cast<float>(1.0 / tokens)));
  ASSIGN_OR_RETURN(double sq, backend_->ReduceGrads());
  double sums[2] = {loss_sum, sq};
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
  if (!info.skipped) RETURN_IF_ERROR(backend_->Update(info.params));
  state_.step = s;
  state_.opt_t = info.opt_t;
  state_.skipped_steps += info.skipped ? 1 : 0;
  state_.loader.batch_index += 1;
  info.loader = state_.loader;
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&stall, ckpt_->AfterUpdate(s, info), sw));
  }
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
    std::printf("step %lld loss %.6f step_ms %.1f stall_ms %.1f%s\n", static_cast<long long>(s),
                sums[0] / tokens, step_ms, stall, info.skipped ? " skipped" : "");
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
  std::printf(
      "summary model=%s nproc=%d step=%lld steps_run=%lld tokens=%.0f tokens_per_s=%.1f "
      "mean_step_ms=%.1f stall_ms_total=%.1f resumed_from=%lld params=%zu params_sha256=%s\n",
      o_.model.c_str(), o_.world_size, static_cast<long long>(state_.step),
      static_cast<long long>(steps_run_), tokens,
      total_ms_ > 0 ? tokens / (total_ms_ / 1000.0) : 0.0,
      steps_run_ > 0 ? total_ms_ / steps_run_ : 0.0, total_stall_ms_,
      static_cast<long long>(resumed_from_), params.size(), sha.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status RankRunner::Run() {
  RETURN_IF_ERROR(Setup());
  RETURN_IF_ERROR(Resume());
  ASSIGN_OR_RETURN(ckpt_, MakeCheckpointer(o_.ckpt, backend_->View(), store_.get()));
  RETURN_IF_ERROR(ckpt_->Start(state_));
  for (int64_t s = state_.step + 1; s <= o_.steps; ++s) RETURN_IF_ERROR(Step(s));
  {
    Stopwatch sw;
    RETURN_IF_ERROR(Timed(&total_stall_ms_, ckpt_->Finish(), sw));
  }
  return Summary();
}

}  // namespace

absl::Status RunRank(const TrainOptions& options) {
  RankRunner runner(options);
  return runner.Run();
}

}  // namespace trainer
}  // namespace gradsnap
