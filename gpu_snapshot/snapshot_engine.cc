// The training thread's side of the snapshot engine: the hooks, the GoCkpt block schedule,
// gradient copies and stall accounting. The worker side is engine_worker.cc.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/deadline_wait.h"
#include "common/logging.h"
#include "common/status.h"
#include "gpu_snapshot/engine_impl.h"

namespace gradsnap {
namespace gpu_snapshot {

double BusiestWindowStepBytes(size_t state_bytes, size_t grad_bytes, bool grad_log, int k) {
  const double state = static_cast<double>(state_bytes), grad = static_cast<double>(grad_bytes);
  k = std::max(1, k);
  return state / k + (grad_log ? grad : grad * (k - 1) / k);
}

double WindowOverflowBytes(size_t state_bytes, size_t grad_bytes, bool grad_log, int k,
                           double capacity) {
  const double state = static_cast<double>(state_bytes), grad = static_cast<double>(grad_bytes);
  k = std::max(1, k);
  double over = 0;
  for (int t = 1; t <= k; ++t) {  // step t copies block t-1 and the gradients before it
    const double asked = state / k + (grad_log ? grad : grad * (t - 1) / k);
    over += std::max(0.0, asked - capacity);
  }
  if (grad_log) over -= k * std::max(0.0, grad - capacity);  // the log's own, window or not
  return over;
}

WindowChoice ChooseWindow(const WindowInputs& in) {
  WindowChoice c;
  c.in = in;
  const int max_window = std::max(1, in.max_window);
  auto busiest = [&](int k) {
    return BusiestWindowStepBytes(in.state_bytes, in.grad_bytes, in.grad_log, k);
  };
  c.measured = in.bandwidth > 0 && in.step_seconds > 0 && in.fill > 0;  // NaN: not measured
  if (!c.measured) {
    c.k = std::min(4, max_window);
  } else {
    c.step_capacity_bytes = in.bandwidth * in.step_seconds * in.fill;
    c.k = 1;
    while (c.k < max_window && busiest(c.k) > c.step_capacity_bytes) ++c.k;
    c.fits = busiest(c.k) <= c.step_capacity_bytes;
    if (!c.fits) {
      double least = -1;
      for (int k = 1; k <= max_window; ++k) {
        const double over = WindowOverflowBytes(in.state_bytes, in.grad_bytes, in.grad_log, k,
                                                c.step_capacity_bytes);
        if (least < 0 || over <= least) least = over, c.k = k;  // ties: the longer window
      }
    }
  }
  c.busiest_step_bytes = busiest(c.k);
  return c;
}

absl::StatusOr<std::unique_ptr<SnapshotEngine>> SnapshotEngine::Create(
    Device* device, const DeviceState& state, const SnapshotEngineOptions& options,
    SnapshotSink* sink) {
  if (device == nullptr || sink == nullptr) return absl::InvalidArgumentError("null device/sink");
  if (state.numel == 0 || state.params == nullptr || state.m == nullptr || state.v == nullptr) {
    return absl::InvalidArgumentError("snapshot engine needs a non-empty state");
  }
  if (options.grad_dtype != DType::kF32 && options.grad_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("gradient dtype must be f32 or bf16");
  }
  if (options.chunk_bytes % 64 != 0 || options.chunk_bytes == 0) {
    return absl::InvalidArgumentError("chunk_bytes must be a positive multiple of 64");
  }
  if (options.window < 0 || options.grad_log_buffers < 1) {
    return absl::InvalidArgumentError("window must be >= 0 and grad_log_buffers >= 1");
  }
  auto engine = std::make_unique<EngineImpl>(device, state, options, sink);
  RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<SnapshotEngine>(std::move(engine));
}

EngineImpl::EngineImpl(Device* device, const DeviceState& state,
                       const SnapshotEngineOptions& options, SnapshotSink* sink)
    : device_(device), dev_(state), opt_(options), sink_(sink),
      grad_elem_bytes_(DTypeSize(options.grad_dtype)) {}

absl::Status EngineImpl::Init() {
  // Small states get smaller chunks, so the gradient pool (a few chunks) stays within its
  // share of the state's size.
  const size_t pool_budget = std::min<size_t>(
      opt_.grad_pool_max_bytes, static_cast<size_t>(opt_.grad_pool_fraction * state_bytes()));
  chunk_bytes_ = std::min<size_t>(opt_.chunk_bytes, std::max<size_t>(4096, pool_budget / 4));
  chunk_bytes_ = chunk_bytes_ / 64 * 64;
  ASSIGN_OR_RETURN(queue_, CopyQueue::Create(device_, chunk_bytes_, opt_.copy_depth,
                                             opt_.trace));
  replay_ = std::make_unique<ReplayPool>(opt_.replay_threads);
  if (opt_.mode != SnapshotMode::kNone) {
    ASSIGN_OR_RETURN(staging_, PinnedBuffer::Create(device_, state_bytes(), &account_));
  }
  if (opt_.mode == SnapshotMode::kGoCkpt && !opt_.grad_log) {
    // At least copy_depth chunks: the dispatcher waits for a free chunk while up to depth - 1
    // chunks are in flight, and only landed chunks are ever released.
    size_t count = std::max<size_t>({2, static_cast<size_t>(opt_.copy_depth),
                                     pool_budget / chunk_bytes_});
    ASSIGN_OR_RETURN(pool_, StagingPool::Create(device_, chunk_bytes_, count, &account_));
  }
  if (opt_.grad_log) {
    for (int i = 0; i < opt_.grad_log_buffers; ++i) {
      ASSIGN_OR_RETURN(auto b,
                       PinnedBuffer::Create(device_, dev_.numel * grad_elem_bytes_, &account_));
      log_bufs_.push_back(std::move(b));
    }
    absl::MutexLock lock(&mu_);
    log_free_.assign(log_bufs_.size(), true);
  }
  if (staging_ != nullptr) {
    // Probe the copy bandwidth once so the first automatic K has a figure to work with.
    size_t probe = std::min<size_t>(dev_.numel * sizeof(float), 8u << 20);
    ASSIGN_OR_RETURN(std::shared_ptr<ComputeEvent> after,
                     device_->RecordComputeEvent(dev_.compute_stream));
    CopyTicket t = queue_->Submit({CopyPriority::kState, dev_.params, probe,
                                   [this](size_t off, size_t) {
                                     return static_cast<char*>(staging_->data()) + off;
                                   },
                                   nullptr, "probe", std::move(after)});
    RETURN_IF_ERROR(AwaitCopies(t));
  }
  worker_ = std::thread([this] { WorkerLoop(); });
  return absl::OkStatus();
}

EngineImpl::~EngineImpl() {
  if (!finished_) {
    absl::Status s = Finish();
    if (!s.ok()) GS_LOG(WARNING) << "snapshot engine: " << s;
  }
  Push(SimpleEvent(EngineEvent::kStop, 0));
  if (worker_.joinable()) worker_.join();  // not started when Init failed
  queue_.reset();
}

void EngineImpl::SetBaseStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  initial_base_ = step;
}

void EngineImpl::Push(EngineEvent e) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(e));
}

HostStateRef EngineImpl::Staged() const {
  float* base = static_cast<float*>(staging_->data());
  return {base, base + dev_.numel, base + 2 * dev_.numel, dev_.numel};
}

bool EngineImpl::in_flight() const {
  absl::MutexLock lock(&mu_);
  return full_in_flight_;
}

EngineCounters EngineImpl::counters() const {
  absl::MutexLock lock(&mu_);
  EngineCounters c = counters_;
  c.copied_bytes = queue_->bytes_copied();
  return c;
}

int EngineImpl::NextWindow() const { return NextWindowChoice().k; }

WindowChoice EngineImpl::NextWindowChoice() const {
  WindowInputs in;
  in.state_bytes = state_bytes();
  in.grad_bytes = grad_bytes();
  in.grad_log = opt_.grad_log;
  in.bandwidth = queue_->bandwidth();
  in.step_seconds = compute_seconds_;
  in.fill = opt_.window_fill;
  in.max_window = opt_.max_window;
  WindowChoice c = ChooseWindow(in);
  if (opt_.window > 0) {  // fixed K: the same figures for it
    c.k = static_cast<int>(std::min<size_t>(opt_.window, dev_.numel));
    c.busiest_step_bytes = BusiestWindowStepBytes(in.state_bytes, in.grad_bytes, in.grad_log, c.k);
    c.fits = !c.measured || c.busiest_step_bytes <= c.step_capacity_bytes;
  }
  return c;
}

absl::Status EngineImpl::AwaitCopies(CopyTicket t) {
  const absl::Duration limit = opt_.copy_stall_timeout.count() > 0
                                   ? absl::FromChrono(opt_.copy_stall_timeout)
                                   : absl::InfiniteDuration();
  absl::Status s;
  if (queue_->WaitUnlessStalled(t, limit, &s)) return s;
  // No copy landed for the whole deadline: they wait behind device work that never ends.
  const std::string aborted =
      opt_.abort_collectives ? opt_.abort_collectives() : std::string("nothing");
  return CollectiveDeadlineError(
      {absl::StrCat("the snapshot copies on ", device_->Name(),
                    " (queued after the device's collectives)"),
       opt_.copy_stall_timeout, aborted});
}

absl::Status EngineImpl::WaitCopies(CopyTicket t) {
  return Stall([&] { return AwaitCopies(t); });
}

absl::Status EngineImpl::Stall(const std::function<absl::Status()>& wait) {
  int64_t t0 = MonotonicNanos();
  int64_t start_us = opt_.trace ? opt_.trace->NowMicros() : 0;
  absl::Status s = wait();
  int64_t dt = MonotonicNanos() - t0;
  stall_ns_ += dt;
  if (opt_.trace && dt > 20000) {
    opt_.trace->Complete("train", "ckpt_stall", start_us, dt / 1000);
  }
  return s;
}

StepStats EngineImpl::TakeStepStats() {
  StepStats out = stats_;
  stats_ = StepStats();
  out.stall_ms = static_cast<double>(stall_ns_) * 1e-6;
  stall_ns_ = 0;
  const double asked = static_cast<double>(step_state_bytes_ + step_grad_bytes_ + step_log_bytes_);
  const double bw = queue_->bandwidth();
  if (asked > 0 && bw > 0 && compute_seconds_ > 0) {
    out.copy_utilization = asked / (bw * compute_seconds_);
  }
  if (opt_.trace != nullptr && last_update_us_ > prev_update_us_) {
    // The copy engine's queue per step: what this step asked of it, by kind.
    const std::string args = absl::StrFormat(
        "{\"state_mb\":%.3f,\"grad_mb\":%.3f,\"log_mb\":%.3f,\"asked_ms\":%.1f,"
        "\"step_ms\":%.1f,\"utilization\":%.3f}",
        step_state_bytes_ * 1e-6, step_grad_bytes_ * 1e-6, step_log_bytes_ * 1e-6,
        bw > 0 ? asked / bw * 1e3 : 0.0, compute_seconds_ * 1e3, out.copy_utilization);
    opt_.trace->Complete("copy engine",
                         absl::StrFormat("step %d asks %.1f MB (%.0f%%)", last_step_,
                                         asked * 1e-6, 100 * out.copy_utilization),
                         prev_update_us_, last_update_us_ - prev_update_us_, args);
    opt_.trace->Counter("copy engine queue (MB)",
                        absl::StrFormat("{\"state\":%.3f,\"grad\":%.3f,\"log\":%.3f}",
                                        step_state_bytes_ * 1e-6, step_grad_bytes_ * 1e-6,
                                        step_log_bytes_ * 1e-6),
                        prev_update_us_);
  }
  step_state_bytes_ = step_grad_bytes_ = step_log_bytes_ = 0;
  absl::MutexLock lock(&mu_);
  counters_.stall_ms_total += out.stall_ms;
  if (out.copy_utilization > 0) {
    counters_.copy_util_max = std::max(counters_.copy_util_max, out.copy_utilization);
    counters_.copy_util_sum += out.copy_utilization;
    ++counters_.copy_util_steps;
  }
  if (!completed_.empty()) {
    out.completed = completed_.back();
    completed_.clear();
  }
  return out;
}

absl::Status EngineImpl::BeforeGradOverwrite(int64_t) {
  if (!opt_.overlap_grads || grad_ticket_ == 0) return absl::OkStatus();
  if (opt_.test_drop_wait == DroppedWait::kGrad) return absl::OkStatus();  // test hook
  CopyTicket t = grad_ticket_;
  grad_ticket_ = 0;
  return WaitCopies(t);
}

int EngineImpl::AcquireLogBuffer() {
  int found = -1;
  absl::Status s = Stall([&] {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::vector<bool>* f) { return std::find(f->begin(), f->end(), true) != f->end(); },
        &log_free_));
    found = static_cast<int>(std::find(log_free_.begin(), log_free_.end(), true) -
                             log_free_.begin());
    log_free_[found] = false;
    return absl::OkStatus();
  });
  return found;
}

absl::Status EngineImpl::AfterBackward(int64_t step, const void* grad) {
  if (finished_) return absl::FailedPreconditionError("snapshot engine finished");
  // A block copied after the previous update must land before this update changes it: waited
  // for here, or with per_block_update_wait in BeforeBlockUpdate, after the caller launched the
  // update of the rest of the slice.
  size_t replay_end = 0;
  if (win_.has_value()) {
    CopyTicket t = block_ticket_;
    if (opt_.per_block_update_wait) {
      held_ = {win_->bounds[win_->submitted - 1], win_->bounds[win_->submitted]};
    } else if (opt_.test_drop_wait != DroppedWait::kBlock) {
      RETURN_IF_ERROR(WaitCopies(t));
    }
    if (win_->submitted >= win_->k) {
      win_.reset();  // every block landed; the worker finishes the replay and persists
    } else {
      replay_end = win_->bounds[win_->submitted];
    }
  }
  const size_t esz = grad_elem_bytes_;
  CopyRequest req;
  req.priority = CopyPriority::kGradient;
  req.src = grad;
  req.label = absl::StrCat("grad ", step);
  req.test_consume_before_landing = opt_.test_drop_wait == DroppedWait::kReplay;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.grad_updates;
  }
  if (opt_.grad_log) {
    req.bytes = dev_.numel * esz;
    // On the host device the record goes straight into memory the sink keeps (one copy of
    // the gradient, not two); else, or when the sink has none now, into a log buffer.
    void* lent = device_->IsHost() ? sink_->LendDeltaBuffer(req.bytes) : nullptr;
    const int buf = lent != nullptr ? -1 : AcquireLogBuffer();
    char* dst = static_cast<char*>(lent != nullptr ? lent : log_bufs_[buf]->data());
    step_log_bytes_ += req.bytes;
    req.dst = [dst](size_t off, size_t) { return dst + off; };
    req.on_chunk = [this, step, replay_end, esz, buf, lent, total = req.bytes](
                       size_t off, size_t n, void* d) {
      if (replay_end > off / esz) {
        Push(ChunkEvent(step, d, off / esz, n / esz, replay_end, nullptr));
      }
      if (off + n == total) {
        EngineEvent done = SimpleEvent(EngineEvent::kGradDone, step);
        done.log_buf = buf;
        done.lent = lent;
        Push(done);
      }
    };
  } else if (replay_end > 0) {
    req.bytes = replay_end * esz;
    step_grad_bytes_ += req.bytes;
    req.dst = [this](size_t, size_t) { return pool_->Acquire(); };
    req.on_chunk = [this, step, replay_end, esz](size_t off, size_t n, void* d) {
      Push(ChunkEvent(step, d, off / esz, n / esz, replay_end, d));
    };
  } else {
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&mu_);
    counters_.grad_bytes_copied += req.bytes;
  }
  // Recorded now, on the training thread: the gradients are final at this point of the stream.
  ASSIGN_OR_RETURN(req.after, device_->RecordComputeEvent(dev_.compute_stream));
  if (!held_.empty()) {
    held_grad_ = std::move(req);  // submitted once the held block landed (BeforeBlockUpdate)
  } else {
    grad_ticket_ = queue_->Submit(std::move(req));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::BeforeBlockUpdate(int64_t) {
  if (held_.empty()) return absl::OkStatus();
  held_ = ElemRange();
  // The one block copy this update's optimizer must not overtake; the rest of the update is
  // already running on the device.
  CopyTicket t = block_ticket_;
  if (opt_.test_drop_wait != DroppedWait::kBlock) {
    RETURN_IF_ERROR(WaitCopies(t));
  }
  if (held_grad_.has_value()) {
    grad_ticket_ = queue_->Submit(std::move(*held_grad_));
    held_grad_.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<CopyTicket> EngineImpl::SubmitStateRange(size_t begin, size_t end,
                                                        const char* label,
                                                        std::optional<EngineEvent> on_landed) {
  float* host[3] = {Staged().params, Staged().m, Staged().v};
  float* dev[3] = {dev_.params, dev_.m, dev_.v};
  // One compute event for the whole block, recorded now on the training thread: the block's
  // params, m and v copies all wait for the update that produced them and for nothing later.
  ASSIGN_OR_RETURN(std::shared_ptr<ComputeEvent> after,
                   device_->RecordComputeEvent(dev_.compute_stream));
  CopyTicket t = 0;
  for (int i = 0; i < 3; ++i) {
    CopyRequest req;
    req.priority = CopyPriority::kState;
    req.src = dev[i] + begin;
    req.bytes = (end - begin) * sizeof(float);
    step_state_bytes_ += req.bytes;
    state_copied_in_step_ = true;
    req.after = after;
    req.label = label;
    char* dst = reinterpret_cast<char*>(host[i] + begin);
    req.dst = [dst](size_t off, size_t) { return dst + off; };
    if (i == 2 && on_landed.has_value()) {
      req.on_chunk = [this, ev = *on_landed, total = req.bytes](size_t off, size_t n, void*) {
        if (off + n == total) Push(ev);
      };
    }
    t = queue_->Submit(std::move(req));  // same priority, FIFO: the last one lands last
  }
  return t;
}

absl::Status EngineImpl::StartFull(const UpdateRecord& info, int k) {
  const int64_t u = info.step;
  stats_.started = true;
  stats_.window = k;
  if (opt_.trace) {
    opt_.trace->Instant("train", absl::StrCat("ckpt start ", u, " K=", k));
  }
  if (opt_.mode != SnapshotMode::kGoCkpt) {
    // Stop-the-world copy; the worker hands the snapshot to the sink.
    ASSIGN_OR_RETURN(CopyTicket t, SubmitStateRange(0, dev_.numel, "state (blocking)",
                                                    CloseEvent(u, 1, u)));
    RETURN_IF_ERROR(WaitCopies(t));
    if (opt_.mode == SnapshotMode::kSync) {
      RETURN_IF_ERROR(Stall([&] {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(+[](bool* b) { return !*b; }, &full_in_flight_));
        return absl::OkStatus();
      }));
    }
    return absl::OkStatus();
  }
  win_ = Window();
  win_->s = u;
  win_->k = k;
  win_->bounds.resize(k + 1);
  for (int j = 0; j <= k; ++j) {
    size_t b = dev_.numel * j / k;
    win_->bounds[j] = j == k ? dev_.numel : b / 16 * 16;
  }
  std::optional<EngineEvent> close;
  if (k == 1) {
    close = CloseEvent(u, 1, u);
  }
  ASSIGN_OR_RETURN(block_ticket_,
                   SubmitStateRange(win_->bounds[0], win_->bounds[1], "block 0", close));
  win_->submitted = 1;
  return absl::OkStatus();
}

absl::Status EngineImpl::AfterUpdate(const UpdateRecord& info, bool checkpoint_due) {
  if (finished_) return absl::FailedPreconditionError("snapshot engine finished");
  RETURN_IF_ERROR(BeforeBlockUpdate(info.step));  // a caller that did not call it
  const int64_t u = info.step;
  int64_t now = MonotonicNanos();
  if (last_update_ns_ != 0) {
    // The step time a window's copies must hide in: measured on steps without state copies (a
    // window's own stall would make it look longer than it is), or on any step while none such
    // has been seen. A host wait inside the step need not be a stall (the device may be busy
    // meanwhile), so it is not subtracted.
    const double dt = static_cast<double>(now - last_update_ns_) * 1e-9;
    if (!state_copied_in_step_ || compute_seconds_ == 0) {
      compute_seconds_ = compute_seconds_ == 0 ? dt : 0.8 * compute_seconds_ + 0.2 * dt;
    }
  }
  last_update_ns_ = now;
  state_copied_in_step_ = false;  // the state submitted from here on is copied in the next step
  if (opt_.trace != nullptr) {
    prev_update_us_ = last_update_us_;
    last_update_us_ = opt_.trace->NowMicros();
  }
  last_step_ = u;
  // Decide on a new FULL first: its step must be known before this update's record is.
  int start_k = 0;
  if (checkpoint_due || deferred_pending_) {
    if (!win_.has_value() && !opt_.defer_while_persisting) {
      // Deterministic on every rank: wait for the previous persist instead of deferring.
      RETURN_IF_ERROR(Stall([&] {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(+[](bool* b) { return !*b; }, &full_in_flight_));
        return absl::OkStatus();
      }));
    }
    bool busy = win_.has_value() || in_flight();
    if (!busy) {
      deferred_pending_ = false;
      if (opt_.mode == SnapshotMode::kGoCkpt) {
        stats_.choice = NextWindowChoice();
        start_k = stats_.choice.k;
        NoteWindowChoice(stats_.choice);
      } else {
        start_k = 1;
      }
      RegisterFull(u + start_k - 1);
    } else if (checkpoint_due) {
      stats_.deferred = true;
      deferred_pending_ = true;
      absl::MutexLock lock(&mu_);
      ++counters_.deferred;
    }
  }
  EngineEvent record = SimpleEvent(EngineEvent::kRecord, u);
  record.info = std::make_shared<const UpdateRecord>(info);
  Push(std::move(record));
  if (opt_.test_drop_wait == DroppedWait::kReplay && grad_ticket_ != 0) {
    // Test hook: the worker replays this update's first gradient chunk, enqueued but not
    // landed, before the host goes on (and so before anything demands the copy).
    queue_->WaitStarted(grad_ticket_);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::deque<EngineEvent>* q) { return q->empty(); }, &events_));
  }
  if (!opt_.overlap_grads && grad_ticket_ != 0 && opt_.test_drop_wait != DroppedWait::kGrad) {
    CopyTicket t = grad_ticket_;
    grad_ticket_ = 0;
    RETURN_IF_ERROR(WaitCopies(t));
  }
  if (win_.has_value() && win_->submitted < win_->k) {
    int j = win_->submitted;
    std::optional<EngineEvent> close;
    if (j == win_->k - 1) {
      close = CloseEvent(u, win_->k, win_->s);
    }
    ASSIGN_OR_RETURN(block_ticket_,
                     SubmitStateRange(win_->bounds[j], win_->bounds[j + 1], "block", close));
    win_->submitted = j + 1;
  }
  if (start_k > 0) return StartFull(info, start_k);
  return absl::OkStatus();
}

void EngineImpl::NoteWindowChoice(const WindowChoice& c) {
  const bool automatic = opt_.window == 0;
  if (automatic && c.measured && !c.fits && !unfit_said_) {
    unfit_said_ = true;
    GS_LOG(WARNING) << absl::StrFormat(
        "gockpt: no window K <= %d fits the copy engine: the busiest window step asks %.1f MB "
        "(state %.1f MB / K + gradient %.1f MB%s) of %.1f MB a step can copy (%.1f MB/s x "
        "%.0f ms x fill %.2f); using K = %d, the least overflow (counted as window_unfit)",
        c.in.max_window, c.busiest_step_bytes * 1e-6, c.in.state_bytes * 1e-6,
        c.in.grad_bytes * 1e-6, c.in.grad_log ? ", the gradient log's" : " x (K - 1) / K",
        c.step_capacity_bytes * 1e-6, c.in.bandwidth * 1e-6, c.in.step_seconds * 1e3, c.in.fill,
        c.k);
  }
  if (opt_.trace != nullptr) {
    opt_.trace->Instant(
        "train", absl::StrCat("window K=", c.k, c.fits ? "" : " (no K fits)"),
        absl::StrFormat("{\"k\":%d,\"automatic\":%d,\"measured\":%d,\"fits\":%d,"
                        "\"state_bytes\":%d,\"grad_bytes\":%d,\"grad_log\":%d,"
                        "\"copy_mb_per_s\":%.1f,\"step_ms\":%.1f,\"fill\":%.2f,"
                        "\"max_window\":%d,\"busiest_step_mb\":%.3f,\"step_capacity_mb\":%.3f}",
                        c.k, automatic ? 1 : 0, c.measured ? 1 : 0, c.fits ? 1 : 0,
                        c.in.state_bytes, c.in.grad_bytes, c.in.grad_log ? 1 : 0,
                        c.in.bandwidth * 1e-6, c.in.step_seconds * 1e3, c.in.fill,
                        c.in.max_window, c.busiest_step_bytes * 1e-6,
                        c.step_capacity_bytes * 1e-6));
  }
  absl::MutexLock lock(&mu_);
  counters_.last_window = c;
  if (automatic && c.measured && !c.fits) ++counters_.window_unfit;
}

void EngineImpl::RegisterFull(int64_t target) {
  absl::MutexLock lock(&mu_);
  full_in_flight_ = true;
  full_targets_.insert(target);
  ++counters_.fulls_started;
}

absl::Status EngineImpl::CloseWindowEarly() {
  // Everything not yet copied is copied now, blocking, as of the last update.
  CopyTicket t = block_ticket_;
  RETURN_IF_ERROR(WaitCopies(t));
  if (win_->submitted < win_->k && opt_.grad_log) {
    // Every update of the window is in the gradient log already, and the log may hold a
    // DELTA of the last step: abandon the window instead of writing a FULL of that step.
    absl::MutexLock lock(&mu_);
    full_targets_.erase(win_->s + win_->k - 1);
    full_in_flight_ = false;
    ++counters_.abandoned;
  } else if (win_->submitted < win_->k) {
    EngineEvent close = CloseEvent(last_step_, win_->k, win_->s);
    {
      absl::MutexLock lock(&mu_);
      full_targets_.erase(win_->s + win_->k - 1);
      full_targets_.insert(last_step_);
      ++counters_.closed_early;
    }
    ASSIGN_OR_RETURN(t, SubmitStateRange(win_->bounds[win_->submitted], dev_.numel,
                                         "rest (blocking)", close));
    RETURN_IF_ERROR(WaitCopies(t));
  }
  win_.reset();
  return absl::OkStatus();
}

absl::Status EngineImpl::Finish() {
  if (finished_) return absl::OkStatus();
  const int64_t t0 = MonotonicNanos();
  absl::Status held = BeforeBlockUpdate(last_step_);
  finished_ = true;
  RETURN_IF_ERROR(held);
  if (grad_ticket_ != 0) {
    CopyTicket t = grad_ticket_;
    grad_ticket_ = 0;
    RETURN_IF_ERROR(WaitCopies(t));
  }
  if (win_.has_value()) RETURN_IF_ERROR(CloseWindowEarly());
  RETURN_IF_ERROR(WaitCopies(0));
  const int64_t t1 = MonotonicNanos();
  // Whatever happens below, the two parts are counted (EngineCounters::finish_copy_ms).
  struct Count {
    EngineImpl* e;
    int64_t t0, t1;
    ~Count() {
      absl::MutexLock lock(&e->mu_);
      e->counters_.finish_copy_ms = static_cast<double>(t1 - t0) * 1e-6;
      e->counters_.finish_handover_ms = static_cast<double>(MonotonicNanos() - t1) * 1e-6;
    }
  } count{this, t0, t1};
  // Every update that ran pushed its record before Finish: what is still parked belongs to a
  // step that failed after its gradient copy, and would hold its log buffer for ever.
  Push(SimpleEvent(EngineEvent::kDropParked, 0));
  return Stall([&] {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](EngineImpl* e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !e->full_in_flight_ && e->events_.empty() &&
                 std::find(e->log_free_.begin(), e->log_free_.end(), false) ==
                     e->log_free_.end();
        },
        this));
    return counters_.first_error;
  });
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
