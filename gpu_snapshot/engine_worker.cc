// The worker thread of the snapshot engine: applies gradient chunks to the staged blocks (host
// replay), turns landed gradients into DELTA records, and hands finished snapshots to the sink.
// Events arrive in the order the copies landed; an event of update u that arrives before u's
// record (the AdamWStepParams and skip flag, known only once the update ran) is parked until it.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "gpu_snapshot/engine_impl.h"

namespace gradsnap {
namespace gpu_snapshot {

void EngineImpl::WorkerLoop() {
  EnterRole(ThreadRole::kBackground);
  for (;;) {
    EngineEvent e;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::deque<EngineEvent>* q) { return !q->empty(); }, &events_));
      e = std::move(events_.front());
    }
    if (e.kind == EngineEvent::kStop) return;
    Handle(e);
    // Popped only after handling, so Finish() sees an empty queue only when all is done.
    absl::MutexLock lock(&mu_);
    events_.pop_front();
  }
}

void EngineImpl::Handle(EngineEvent& e) {
  switch (e.kind) {
    case EngineEvent::kRecord:
      HandleRecord(e);
      return;
    case EngineEvent::kChunk:
    case EngineEvent::kGradDone:
      // Both need the step's update record: parked until it arrives.
      if (records_.count(e.step) == 0) {
        parked_.push_back(std::move(e));
      } else if (e.kind == EngineEvent::kChunk) {
        ReplayChunk(e);
      } else {
        EmitDelta(e);
      }
      return;
    case EngineEvent::kClose:
      EmitFull(e);
      return;
    case EngineEvent::kDropParked:
      for (EngineEvent& p : parked_) {
        if (p.pool_chunk != nullptr) pool_->Release(p.pool_chunk);
        if (p.kind == EngineEvent::kGradDone) FreeLogBuffer(p);
      }
      if (!parked_.empty()) {
        GS_LOG(WARNING) << "snapshot engine: " << parked_.size()
                        << " gradient copies of updates that never ran dropped at finish";
      }
      parked_.clear();
      return;
    case EngineEvent::kStop:
      return;
  }
}

void EngineImpl::HandleRecord(EngineEvent& e) {
  const int64_t u = e.step;
  records_[u] = e.info;
  // Keep the records a window's Close may still need (its small state): a block copy may land
  // after later updates ran (a slow copy engine).
  const int64_t keep = std::max<int64_t>({opt_.window, opt_.max_window, 1}) + 2;
  while (!records_.empty() && records_.begin()->first < u - keep) {
    records_.erase(records_.begin());
  }
  std::deque<EngineEvent> still;
  for (EngineEvent& p : parked_) {
    if (p.step != u) {
      still.push_back(std::move(p));
    } else if (p.kind == EngineEvent::kChunk) {
      ReplayChunk(p);
    } else {
      EmitDelta(p);
    }
  }
  parked_.swap(still);
}

void EngineImpl::ReplayChunk(const EngineEvent& e) {
  size_t end = std::min(e.elem_begin + e.elem_count, e.replay_end);
  if (end > e.elem_begin) {
    int64_t t0 = MonotonicNanos();
    int64_t start_us = opt_.trace ? opt_.trace->NowMicros() : 0;
    replay_->Apply(Staged(), e.elem_begin, end, e.grad, opt_.grad_dtype, records_[e.step]->params);
    int64_t dt = MonotonicNanos() - t0;
    if (opt_.trace) {
      opt_.trace->Complete("replay", absl::StrCat("replay ", e.step), start_us, dt / 1000,
                           absl::StrCat("{\"elements\":", end - e.elem_begin, "}"));
    }
    absl::MutexLock lock(&mu_);
    counters_.replay_ms_total += static_cast<double>(dt) * 1e-6;
  }
  if (e.pool_chunk != nullptr) pool_->Release(e.pool_chunk);
}

void EngineImpl::FreeLogBuffer(const EngineEvent& e) {
  if (e.log_buf < 0) {
    sink_->ReturnDeltaBuffer(e.lent);
    return;
  }
  absl::MutexLock lock(&mu_);
  log_free_[e.log_buf] = true;
}

void EngineImpl::EmitDelta(const EngineEvent& e) {
  const int64_t step = e.step;
  const int log_buf = e.log_buf;
  int64_t base = -1;
  bool skip = false;
  {
    absl::MutexLock lock(&mu_);
    base = initial_base_ < step ? initial_base_ : -1;
    auto it = full_targets_.lower_bound(step);  // first target >= step
    if (it != full_targets_.begin()) base = std::max(base, *std::prev(it));
    // No FULL to extend yet; or a FULL of this very step is on its way, which is the step's
    // recovery point (and a checkpoint is one per step).
    skip = base < 0 || full_targets_.count(step) != 0;
    if (base < 0) ++counters_.deltas_skipped_no_base;
  }
  if (skip) {
    FreeLogBuffer(e);
    return;
  }
  const UpdateRecord& info = *records_[step];
  DeltaRecord rec;
  rec.step = step;
  rec.base_step = base;
  rec.update = info.params;
  rec.loader_position = info.loader_position;
  rec.small_state = info.small_state;
  rec.grad = log_buf >= 0 ? log_bufs_[log_buf]->data() : e.lent;
  rec.grad_in_lent_buffer = log_buf < 0;
  rec.grad_dtype = opt_.grad_dtype;
  rec.numel = dev_.numel;
  rec.elem_offset = dev_.elem_offset;
  const TraceSpan span(opt_.trace);
  sink_->PersistDelta(rec, [this, log_buf, step, span](absl::Status s) {
    span.End("persist", absl::StrCat("delta ", step));
    // A failed persist degrades checkpointing, never the engine (the sink decides what is
    // fatal); CANCELLED: the sink skipped the record on purpose (its chain was cut).
    absl::MutexLock lock(&mu_);
    if (s.ok()) {
      ++counters_.deltas_persisted;
    } else if (absl::IsCancelled(s)) {
      ++counters_.deltas_skipped_cut;
    } else {
      ++counters_.persist_failures;
    }
    if (log_buf >= 0) log_free_[log_buf] = true;  // a lent buffer is the sink's
  });
}

void EngineImpl::EmitFull(const EngineEvent& e) {
  HostSnapshot snap;
  snap.step = e.step;
  snap.state = Staged();
  auto it = records_.find(e.step);
  if (it != records_.end()) snap.small_state = it->second->small_state;
  snap.window = e.window;
  snap.start_step = e.start_step;
  const TraceSpan span(opt_.trace);
  const int64_t step = e.step;
  sink_->PersistFull(snap, [this, step, span](absl::Status s) {
    span.End("persist", absl::StrCat("full ", step));
    absl::MutexLock lock(&mu_);
    if (s.ok()) {
      ++counters_.fulls_persisted;
      completed_.push_back(step);
    } else {
      // The step stays in full_targets_: the base of later DELTAs is a function of the step
      // numbers alone, equal on every rank. The sink skips the DELTAs of a failed FULL.
      ++counters_.persist_failures;
    }
    full_in_flight_ = false;
  });
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
