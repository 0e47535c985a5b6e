// Adapts the snapshot engine to the trainer's checkpointing seam and persists what it produces
// through the ShardStore on one background thread (FIFO, so every rank issues the collective
// saves in the same order).
//
// Hook mapping (checkpointer.h): BeforeGradOverwrite(s) -> BeforeGradOverwrite (placed by the
// trainer right before the gradients of s-1 are overwritten: before the backward on the CPU,
// before the reduction on CUDA and sim, so with -O a gradient copy overlaps the update,
// all-gather, forward and backward); AfterBackward(s) -> AfterBackward (waits for a block copy
// before the update of s changes the state); EndStep(s) -> AfterUpdate with the replicated state
// of s (the slice is not written between EndStep(s) and AfterBackward(s+1), so block copies
// overlap the next forward and backward).
#include "trainer/snapshot_checkpointer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/ordered_worker.h"
#include "common/status.h"
#include "gpu_snapshot/device.h"
#include "gpu_snapshot/sim_device.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "storage/aligned_buffer.h"
#include "trainer/full_shard.h"
#include "trainer/grad_log_store.h"
#include "trainer/persist_backlog.h"
#include "trainer/persist_guard.h"

namespace gradsnap {
namespace trainer {
namespace {

using gpu_snapshot::DoneFn;

// Persists FULL snapshots and DELTA records through the store, in submission order, from a
// backlog of its own (persist_backlog.h): each record is copied out of the engine's buffer and
// handed back at once (done(OK): taken), so no step waits for the store. A record that does not
// fit the budget is not kept; its persist still goes through the FIFO, where the ranks agree to
// skip it (PersistGuard::Persist, have_data). Every persist runs under the PersistGuard (the
// ranks' agreement, chain cuts, back-off), so a failure degrades checkpointing and never stops
// the engine.
class StoreSink : public gpu_snapshot::SnapshotSink {
 public:
  StoreSink(ShardStore* store, std::string job, const TrainStateView& view, PersistGuard* guard,
            uint64_t budget)
      : store_(store), job_(std::move(job)), view_(view), guard_(guard), backlog_(budget),
        jobs_([this](Job& j) {
          guard_->Persist(j.kind, j.step, j.base, j.work, j.bytes > 0).IgnoreError();
          j.work = nullptr;  // the kept copy's buffer goes back to spare_ (~KeptBuffer)
          backlog_.Release(j.bytes);
          return absl::OkStatus();  // a failed save is counted by the guard, not kept
        }, ThreadRole::kBackground) {}

  void PersistFull(const gpu_snapshot::HostSnapshot& s, DoneFn done) override {
    const size_t n = s.state.numel;
    Job j{client::CheckpointKind::kFull, s.step, -1, nullptr, 0};
    const uint64_t bytes = 3 * n * sizeof(float) + s.small_state.size();
    if (backlog_.TryReserve(bytes)) {
      std::shared_ptr<KeptBuffer> kept = Take(3 * n * sizeof(float));
      float* const p = reinterpret_cast<float*>(kept->data());
      std::copy_n(s.state.params, n, p);
      std::copy_n(s.state.m, n, p + n);
      std::copy_n(s.state.v, n, p + 2 * n);
      j.bytes = bytes;
      j.work = [this, kept, p, n, step = s.step, small = s.small_state] {
        ASSIGN_OR_RETURN(ReplicatedState st, ReplicatedState::Parse(small));
        return SaveFullShard(*store_, job_, step, view_, p, p + n, p + 2 * n, st);
      };
    }
    done(absl::OkStatus());  // the engine's staging copy is free again
    Enqueue(std::move(j));
  }

  void PersistDelta(const gpu_snapshot::DeltaRecord& r, DoneFn done) override {
    const size_t grad_bytes = r.numel * DTypeSize(r.grad_dtype);
    const size_t small = r.small_state.size();
    Job j{client::CheckpointKind::kDelta, r.step, r.base_step, nullptr, 0};
    std::shared_ptr<KeptBuffer> grad;
    if (r.grad_in_lent_buffer) {
      // The gradient is in memory lent for it (its bytes reserved then): kept as it is. The
      // small state is a few KiB; reserved too, or kept beyond the budget when it does not fit.
      grad = Reclaim(r.grad);
      j.bytes = grad_bytes + (backlog_.TryReserve(small) ? small : 0);
    } else if (backlog_.TryReserve(grad_bytes + small)) {
      grad = Take(grad_bytes);
      std::memcpy(grad->data(), r.grad, grad_bytes);
      j.bytes = grad_bytes + small;
    }
    if (grad != nullptr) {
      gpu_snapshot::DeltaRecord kept = r;
      kept.grad = grad->data();
      j.work = [this, grad, kept] { return SaveDeltaShard(*store_, job_, view_, kept); };
    }
    done(absl::OkStatus());  // the engine's log buffer is free again (a lent one never was its)
    Enqueue(std::move(j));
  }

  // Makes a spare buffer of each size in `sizes` (as far as the budget holds them), faulted
  // in now, before the first step: the first FULL and DELTA are copied at memcpy speed, not
  // at the speed of page faults on the training cores.
  void Preallocate(const std::vector<size_t>& sizes) {
    absl::MutexLock lock(&spare_mu_);
    for (size_t n : sizes) {
      if (n == 0 || spare_bytes_ + n > backlog_.budget()) continue;
      spare_.emplace_back(KeptBuffer::Fresh(n), n);
      spare_bytes_ += n;
    }
  }

  // A buffer for the next DELTA's gradient, its bytes reserved in the backlog (so a record
  // that does not fit is skipped as without lending: PersistDelta finds no lent buffer).
  // Called on the training thread, so only a spare buffer is lent (faulted in already): when
  // none is free (the store behind), the record goes the copying way, whose fresh buffer is
  // made on the engine's worker.
  void* LendDeltaBuffer(size_t bytes) override {
    if (!backlog_.TryReserve(bytes)) return nullptr;
    std::unique_ptr<storage::AlignedBuffer> spare = TakeSpare(bytes);
    if (spare == nullptr) {
      backlog_.Release(bytes);
      return nullptr;
    }
    auto b = std::make_shared<KeptBuffer>(this, bytes, std::move(spare));
    void* data = b->data();
    absl::MutexLock lock(&spare_mu_);
    lent_.emplace(data, std::move(b));
    return data;
  }
  void ReturnDeltaBuffer(void* buffer) override {
    std::shared_ptr<KeptBuffer> b = Reclaim(buffer);
    const size_t bytes = b->size;
    b.reset();  // back to the spares while its bytes still count as used (~KeptBuffer)
    backlog_.Release(bytes);
  }

  // Waits until every queued persist ran.
  void Drain() { jobs_.Synchronize().IgnoreError(); }
  const PersistBacklog& backlog() const { return backlog_; }

 private:
  struct Job {
    client::CheckpointKind kind;
    int64_t step;
    int64_t base;
    std::function<absl::Status()> work;  // null: not kept (no room)
    uint64_t bytes;                      // reserved in the backlog; 0: not kept
  };
  void Enqueue(Job j) {
    jobs_.Enqueue(std::move(j)).IgnoreError();  // never fails (above)
  }
  // A kept copy's memory. When its record is persisted it goes back to the sink's spare
  // buffers, so the next record of its size is copied into pages already faulted in: a fresh
  // buffer costs a page fault and the zeroing of every page on the engine's worker, which runs
  // on the training cores (on the project's VM about as much as the copy itself). Buffers are
  // on huge pages (common/huge_map.h) and faulted in when made.
  struct KeptBuffer {
    KeptBuffer(StoreSink* sink, size_t n, std::unique_ptr<storage::AlignedBuffer> spare)
        : sink(sink), size(n),
          buf(spare != nullptr ? std::move(spare) : Fresh(n)) {}
    ~KeptBuffer() { sink->Return(std::move(buf), size); }
    char* data() { return reinterpret_cast<char*>(buf->data()); }
    static std::unique_ptr<storage::AlignedBuffer> Fresh(size_t n) {
      auto b = std::make_unique<storage::AlignedBuffer>(n);
      b->Prefault();
      return b;
    }
    StoreSink* const sink;
    const size_t size;
    std::unique_ptr<storage::AlignedBuffer> buf;
  };
  // A spare buffer of n bytes, or null.
  std::unique_ptr<storage::AlignedBuffer> TakeSpare(size_t n) {
    absl::MutexLock lock(&spare_mu_);
    return TakeSpareLocked(n);
  }
  std::unique_ptr<storage::AlignedBuffer> TakeSpareLocked(size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(spare_mu_) {
    for (size_t i = 0; i < spare_.size(); ++i) {
      if (spare_[i].second == n) {
        std::unique_ptr<storage::AlignedBuffer> b = std::move(spare_[i].first);
        spare_bytes_ -= n;
        spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    }
    return nullptr;
  }
  // A buffer of n bytes, a spare one when there is one of that size. Spare buffers are kept
  // only while they and the records held fit in the backlog's budget (Return), so the memory
  // stays within --ckpt-backlog-bytes; a new buffer drops spares of other sizes to make room.
  std::shared_ptr<KeptBuffer> Take(size_t n) {
    std::unique_ptr<storage::AlignedBuffer> reuse;
    {
      absl::MutexLock lock(&spare_mu_);
      reuse = TakeSpareLocked(n);
      // The caller reserved n in the backlog already: its used bytes include this buffer.
      while (reuse == nullptr && !spare_.empty() &&
             backlog_.usage().used + spare_bytes_ > backlog_.budget()) {
        spare_bytes_ -= spare_.front().second;
        spare_.erase(spare_.begin());
      }
    }
    return std::make_shared<KeptBuffer>(this, n, std::move(reuse));
  }
  // The lent buffer at `data` (LendDeltaBuffer), no longer lent.
  std::shared_ptr<KeptBuffer> Reclaim(const void* data) {
    absl::MutexLock lock(&spare_mu_);
    auto it = lent_.find(data);
    GS_CHECK(it != lent_.end()) << "a DELTA buffer that was not lent";
    std::shared_ptr<KeptBuffer> b = std::move(it->second);
    lent_.erase(it);
    return b;
  }
  void Return(std::unique_ptr<storage::AlignedBuffer> data, size_t n) {
    if (data == nullptr) return;
    absl::MutexLock lock(&spare_mu_);
    // Called before backlog_.Release of its record: the record's bytes still count as used.
    if (backlog_.usage().used + spare_bytes_ <= backlog_.budget()) {
      spare_bytes_ += n;
      spare_.emplace_back(std::move(data), n);
    }
  }

  ShardStore* const store_;
  const std::string job_;
  const TrainStateView view_;
  PersistGuard* const guard_;
  PersistBacklog backlog_;
  absl::Mutex spare_mu_;
  std::vector<std::pair<std::unique_ptr<storage::AlignedBuffer>, size_t>> spare_
      ABSL_GUARDED_BY(spare_mu_);
  uint64_t spare_bytes_ ABSL_GUARDED_BY(spare_mu_) = 0;
  // Buffers lent to the engine for a DELTA's gradient, by address, until the record comes.
  absl::flat_hash_map<const void*, std::shared_ptr<KeptBuffer>> lent_ ABSL_GUARDED_BY(spare_mu_);
  OrderedWorker<Job> jobs_;  // last: its destructor runs the queued saves, which use the above
};

class SnapshotCheckpointer : public Checkpointer {
 public:
  SnapshotCheckpointer(const CheckpointerOptions& o, const TrainStateView& view,
                       ShardStore* store, gpu_snapshot::TraceWriter* trace)
      : o_(o), view_(view), store_(store), trace_(trace) {}

  ~SnapshotCheckpointer() override {
    engine_.reset();  // drains into the sink before the sink goes
    sink_.reset();
    guard_.reset();
  }

  absl::Status Start(const ReplicatedState& state) override {
    // The rank's own device (docs/trainer.md, --device_id).
    if (view_.device == DeviceKind::kCuda) {
      ASSIGN_OR_RETURN(device_, gpu_snapshot::NewCudaDevice(view_.device_ordinal));
    } else if (view_.device == DeviceKind::kSim) {
      ASSIGN_OR_RETURN(device_, gpu_snapshot::NewSimDevice(view_.device_ordinal));
    } else {
      device_ = gpu_snapshot::NewHostDevice();
    }
    guard_ = std::make_unique<PersistGuard>(store_, o_, view_.rank,
                                            state.step > 0 ? state.step : -1);
    const uint64_t full_bytes = 3 * view_.count() * sizeof(float);
    // Each record also carries the replicated small state (StoreSink reserves it): the auto
    // budget holds one FULL and 8 DELTAs with it (room for it to grow), or no FULL of a state
    // over the 64 MiB minimum would ever fit.
    const uint64_t small = state.Serialize().size() + 4096;
    const uint64_t budget =
        o_.backlog_bytes > 0
            ? o_.backlog_bytes
            : AutoBacklogBytes(full_bytes + small,
                               view_.count() * DTypeSize(GradDType()) + small, o_.grad_log);
    if (o_.mode != gpu_snapshot::SnapshotMode::kNone && o_.every > 0 && budget < full_bytes &&
        view_.rank == 0) {
      GS_LOG(WARNING) << "--ckpt_backlog_bytes " << budget << " holds no FULL shard of a rank ("
                      << full_bytes << " bytes): every FULL checkpoint will be skipped";
    }
    sink_ = std::make_unique<StoreSink>(store_, o_.job, view_, guard_.get(), budget);
    if (o_.mode != gpu_snapshot::SnapshotMode::kNone && o_.every > 0) {
      sink_->Preallocate({full_bytes, o_.grad_log ? view_.count() * DTypeSize(GradDType()) : 0});
    }
    gpu_snapshot::SnapshotEngineOptions eo;
    eo.mode = o_.mode;
    eo.grad_log = o_.grad_log;
    eo.overlap_grads = o_.overlap_grads;
    // On a device the update is split around the block in flight (trainer.cc): its other
    // blocks run while that one's copy finishes. On cpu the update waits for it whole.
    eo.per_block_update_wait = view_.device != DeviceKind::kCpu;
    eo.grad_dtype = GradDType();
    eo.trace = trace_;
    eo.test_drop_wait = o_.test_drop_wait;
    eo.copy_stall_timeout = o_.copy_stall_timeout;
    eo.abort_collectives = o_.abort_collectives;
    // K must be the same on every rank (the saves are collective): automatic K only alone.
    eo.window = o_.gockpt_window;
    // A window closes before the next FULL is due (K <= every - 1).
    eo.max_window = static_cast<int>(std::max<int64_t>(1, o_.every - 1));
    if (eo.window == 0 && view_.world_size > 1) eo.window = std::min(4, eo.max_window);
    // Every rank must start its FULLs at the same steps (the saves are collective): defer only
    // for a window still copying (a function of the step numbers), wait for a slow persist.
    eo.defer_while_persisting = view_.world_size == 1;
    gpu_snapshot::DeviceState ds{view_.master, view_.m, view_.v, view_.count(), view_.lo,
                                 view_.stream};
    ASSIGN_OR_RETURN(engine_, gpu_snapshot::SnapshotEngine::Create(device_.get(), ds, eo,
                                                                   sink_.get()));
    if (o_.grad_log) {
      // The log continues the chain the run resumed from (grad_log_store.h).
      ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, store_->ListCommitted(o_.job));
      RecoveryPoint rp = FindRecoveryPoint(list, state.step);
      if (rp.full_step >= 0 && rp.step() == state.step) engine_->SetBaseStep(rp.full_step);
    }
    return absl::OkStatus();
  }

  absl::Status BeforeStep(int64_t) override { return absl::OkStatus(); }
  absl::Status BeforeGradOverwrite(int64_t step) override {
    return engine_->BeforeGradOverwrite(step);
  }

  absl::Status AfterBackward(int64_t step, const GradSliceView& g) override {
    DType want = GradDType();
    if (g.dtype != want || g.count() != view_.count()) {
      return absl::FailedPreconditionError(
          absl::StrCat("gradient slice of ", g.count(), " ", DTypeName(g.dtype),
                       " elements; the snapshot engine expects ", view_.count(), " ",
                       DTypeName(want)));
    }
    return engine_->AfterBackward(step, g.data);
  }

  gpu_snapshot::ElemRange BlockInFlight() const override { return engine_->BlockInFlight(); }
  absl::Status BeforeBlockUpdate(int64_t step) override {
    return engine_->BeforeBlockUpdate(step);
  }

  absl::Status AfterUpdate(int64_t, const UpdateInfo& info) override {
    pending_ = info;
    return absl::OkStatus();
  }

  absl::Status EndStep(int64_t step, const ReplicatedState& state) override {
    gpu_snapshot::UpdateRecord u;
    u.step = step;
    u.params.adamw = pending_.params;
    u.params.skipped = pending_.skipped;
    u.loader_position = static_cast<uint64_t>(state.loader.batch_index);
    u.small_state = state.Serialize();
    const bool due = o_.every > 0 && step % o_.every == 0 &&
                     o_.mode != gpu_snapshot::SnapshotMode::kNone;
    RETURN_IF_ERROR(engine_->AfterUpdate(u, due));
    guard_->NoteStepEnd(step);
    RETURN_IF_ERROR(guard_->fatal());
    gpu_snapshot::StepStats st = engine_->TakeStepStats();
    if (view_.rank == 0 && (st.started || st.deferred)) {
      if (st.started && o_.mode == gpu_snapshot::SnapshotMode::kGoCkpt) {
        // The window and what it was chosen from (docs/gockpt.md, "Choosing K").
        const gpu_snapshot::WindowChoice& c = st.choice;
        std::printf(
            "ckpt step %lld %s start window=%d fits=%d busiest_step_mb=%.1f "
            "step_capacity_mb=%.1f copy_mb_per_s=%.1f step_ms=%.1f\n",
            static_cast<long long>(step), gpu_snapshot::SnapshotModeName(o_.mode), st.window,
            c.fits ? 1 : 0, c.busiest_step_bytes * 1e-6, c.step_capacity_bytes * 1e-6,
            c.in.bandwidth * 1e-6, c.in.step_seconds * 1e3);
      } else if (st.started) {
        std::printf("ckpt step %lld %s start window=%d\n", static_cast<long long>(step),
                    gpu_snapshot::SnapshotModeName(o_.mode), st.window);
      } else {
        std::printf("ckpt step %lld deferred (a FULL checkpoint is in flight)\n",
                    static_cast<long long>(step));
      }
      std::fflush(stdout);
    }
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    // The engine's Finish copies what is left of a window that the run's end cut short: stall
    // that FULL causes (printed as finish_ms), apart from the backlog's drain that follows.
    Stopwatch finish;
    absl::Status s = engine_->Finish();
    const double finish_ms = finish.ElapsedMillis();
    Stopwatch drain;
    sink_->Drain();  // the engine handed every record over; the backlog's persists finish
    const double drain_ms = drain.ElapsedMillis();
    if (s.ok()) s = guard_->fatal();
    gpu_snapshot::EngineCounters c = engine_->counters();
    // Gradient bytes copied off the device per update (1 gradient with the log on).
    const double per_step =
        c.grad_updates > 0
            ? static_cast<double>(c.grad_bytes_copied) / static_cast<double>(c.grad_updates)
            : 0.0;
    if (view_.rank == 0) {
      const CheckpointHealth h = guard_->health();
      std::printf(
          "ckpt summary mode=%s grad_log=%d fulls=%lld deferred=%lld deltas=%lld "
          "failures=%lld deltas_skipped=%lld untried=%lld backlog_bytes=%llu "
          "backlog_peak_bytes=%llu finish_ms=%.1f finish_copy_ms=%.1f finish_handover_ms=%.1f "
          "drain_ms=%.1f "
          "replay_ms=%.1f host_bytes=%zu state_bytes=%zu host_mem_ratio=%.3f "
          "grad_bytes=%zu grad_bytes_copied_per_step=%.0f grad_copy_ratio=%.4f "
          "copy_engine_utilization=%.3f copy_engine_utilization_mean=%.3f window_k=%d "
          "window_fits=%d window_unfit=%lld cut_short=%lld\n",
          gpu_snapshot::SnapshotModeName(o_.mode), o_.grad_log ? 1 : 0,
          static_cast<long long>(h.fulls), static_cast<long long>(c.deferred),
          static_cast<long long>(h.deltas), static_cast<long long>(h.failures),
          static_cast<long long>(h.skipped), static_cast<long long>(h.untried),
          static_cast<unsigned long long>(sink_->backlog().budget()),
          static_cast<unsigned long long>(sink_->backlog().usage().peak), finish_ms,
          c.finish_copy_ms, c.finish_handover_ms, drain_ms,
          c.replay_ms_total,
          engine_->host_bytes_peak(), engine_->state_bytes(),
          static_cast<double>(engine_->host_bytes_peak()) /
              static_cast<double>(engine_->state_bytes()),
          engine_->grad_bytes(), per_step, per_step / static_cast<double>(engine_->grad_bytes()),
          c.copy_util_max, c.copy_util_steps > 0 ? c.copy_util_sum / c.copy_util_steps : 0.0,
          c.last_window.k, c.last_window.fits ? 1 : 0, static_cast<long long>(c.window_unfit),
          static_cast<long long>(c.closed_early + c.abandoned));
      std::fflush(stdout);
    }
    return s;
  }

  CheckpointHealth Health() const override {
    return guard_ != nullptr ? guard_->health() : CheckpointHealth();
  }

 private:
  // The gradient the optimizer reads: bf16 on CUDA and sim (mixed precision), fp32 on cpu.
  DType GradDType() const {
    return view_.device == DeviceKind::kCpu ? DType::kF32 : DType::kBF16;
  }

  const CheckpointerOptions o_;
  const TrainStateView view_;
  ShardStore* const store_;
  gpu_snapshot::TraceWriter* const trace_;
  std::unique_ptr<gpu_snapshot::Device> device_;
  std::unique_ptr<PersistGuard> guard_;
  std::unique_ptr<StoreSink> sink_;
  std::unique_ptr<gpu_snapshot::SnapshotEngine> engine_;
  UpdateInfo pending_;
};

// Compute phases are the gaps between hooks: BeforeStep..BeforeGradOverwrite the batch (and on a
// device the launch of the forward and backward), ..AfterBackward forward + backward + gradient
// reduction (on a device: the wait for them), AfterBackward..AfterUpdate the clip and optimizer update,
// AfterUpdate..EndStep the parameter all-gather.
int64_t ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

class TracingCheckpointer : public Checkpointer {
 public:
  TracingCheckpointer(std::unique_ptr<Checkpointer> inner,
                      std::unique_ptr<gpu_snapshot::TraceWriter> trace)
      : inner_(std::move(inner)), trace_(std::move(trace)) {}
  ~TracingCheckpointer() override {
    inner_.reset();
    absl::Status s = trace_->Flush();
    if (!s.ok()) GS_LOG(WARNING) << "trace: " << s;
  }
  absl::Status Start(const ReplicatedState& st) override {
    return Hook("ckpt start", "", [&] { return inner_->Start(st); });
  }
  absl::Status BeforeStep(int64_t s) override {
    return Hook("ckpt before_step", "", [&] { return inner_->BeforeStep(s); });
  }
  // Each step hook is traced with the compute phase that ended when it began (named after the
  // phase and the step).
  absl::Status BeforeGradOverwrite(int64_t s) override {
    // cpu: after loading the batch; cuda, sim: after launching the forward and backward.
    return StepHook("ckpt before_grad_overwrite", "batch", s,
                    [&] { return inner_->BeforeGradOverwrite(s); });
  }
  absl::Status AfterBackward(int64_t s, const GradSliceView& g) override {
    return StepHook("ckpt after_backward", "forward+backward", s,
                    [&] { return inner_->AfterBackward(s, g); });
  }
  gpu_snapshot::ElemRange BlockInFlight() const override { return inner_->BlockInFlight(); }
  absl::Status BeforeBlockUpdate(int64_t s) override {
    // cuda, sim: after launching the update of the slice but the block in flight.
    return StepHook("ckpt before_block_update", "update (other blocks)", s,
                    [&] { return inner_->BeforeBlockUpdate(s); });
  }
  absl::Status AfterUpdate(int64_t s, const UpdateInfo& i) override {
    return StepHook("ckpt after_update", "update", s, [&] { return inner_->AfterUpdate(s, i); });
  }
  absl::Status EndStep(int64_t s, const ReplicatedState& st) override {
    return StepHook("ckpt end_step", "allgather", s, [&] { return inner_->EndStep(s, st); });
  }
  CheckpointHealth Health() const override { return inner_->Health(); }
  absl::Status FlushDiagnostics() override { return trace_->Flush(); }
  absl::Status Finish() override {
    absl::Status s = Hook("ckpt finish", "", [&] { return inner_->Finish(); });
    absl::Status f = trace_->Flush();
    return s.ok() ? f : s;
  }

 private:
  absl::Status StepHook(const char* name, const char* phase, int64_t s,
                        const std::function<absl::Status()>& fn) {
    return Hook(name, absl::StrCat(phase, " ", s), fn);
  }
  absl::Status Hook(const char* name, const std::string& phase,
                    const std::function<absl::Status()>& fn) {
    int64_t t0 = trace_->NowMicros();
    if (!phase.empty() && last_exit_us_ >= 0) {
      trace_->Complete("train", phase, last_exit_us_, t0 - last_exit_us_);
    }
    const int64_t cpu0 = ThreadCpuMicros();
    absl::Status s = fn();
    last_exit_us_ = trace_->NowMicros();
    // The hook's own CPU time beside its wall time: the rest it waited (for a copy, a lock) or
    // was preempted by another thread.
    trace_->Complete("train", name, t0, last_exit_us_ - t0,
                     absl::StrCat("{\"cpu_us\":", ThreadCpuMicros() - cpu0, "}"));
    return s;
  }

  std::unique_ptr<Checkpointer> inner_;
  std::unique_ptr<gpu_snapshot::TraceWriter> trace_;
  int64_t last_exit_us_ = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpointer>> NewSnapshotCheckpointer(
    const CheckpointerOptions& options, const TrainStateView& view, ShardStore* store,
    gpu_snapshot::TraceWriter* trace) {
  if (store == nullptr) {
    return absl::FailedPreconditionError("the snapshot checkpointers need a store");
  }
  return std::unique_ptr<Checkpointer>(new SnapshotCheckpointer(options, view, store, trace));
}

std::unique_ptr<Checkpointer> NewTracingCheckpointer(
    std::unique_ptr<Checkpointer> inner, std::unique_ptr<gpu_snapshot::TraceWriter> trace) {
  return std::make_unique<TracingCheckpointer>(std::move(inner), std::move(trace));
}

}  // namespace trainer
}  // namespace gradsnap
