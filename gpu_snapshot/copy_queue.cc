#include "gpu_snapshot/copy_queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/thread_priority.h"

namespace gradsnap {
namespace gpu_snapshot {

absl::StatusOr<std::unique_ptr<CopyQueue>> CopyQueue::Create(Device* device, size_t chunk_bytes,
                                                             int depth, TraceWriter* trace) {
  if (chunk_bytes == 0 || depth < 1) {
    return absl::InvalidArgumentError("copy queue needs chunk_bytes > 0 and depth >= 1");
  }
  std::unique_ptr<CopyQueue> q(new CopyQueue(chunk_bytes, depth, trace));
  for (int p = 0; p < kNumPriorities; ++p) {
    ASSIGN_OR_RETURN(q->streams_[p], device->NewStream(/*high_priority=*/p == 0));
  }
  q->thread_ = std::thread([raw = q.get()] { raw->Run(); });
  return q;
}

CopyQueue::~CopyQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

CopyTicket CopyQueue::Submit(CopyRequest request) {
  absl::MutexLock lock(&mu_);
  CopyTicket t = next_ticket_++;
  if (request.bytes == 0 || !status_.ok()) return t;
  auto req = std::make_shared<Request>();
  req->ticket = t;
  req->chunks_left = (request.bytes + chunk_bytes_ - 1) / chunk_bytes_;
  req->r = std::move(request);
  pending_[static_cast<int>(req->r.priority)].push_back(req);
  open_[t] = req;
  return t;
}

bool CopyQueue::Done(CopyTicket t) {
  absl::MutexLock lock(&mu_);
  return open_.count(t) == 0;
}

void CopyQueue::Demand(CopyTicket t) {
  bool streams[kNumPriorities] = {false, false};
  {
    absl::MutexLock lock(&mu_);
    // A stream runs its copies in order: waiting for t waits for the earlier requests of its
    // priority too.
    int prio = -1;
    if (t != 0) {
      auto it = open_.find(t);
      if (it == open_.end()) return;
      prio = static_cast<int>(it->second->r.priority);
    }
    for (auto& [ticket, req] : open_) {
      const int p = static_cast<int>(req->r.priority);
      if (t != 0 && (ticket > t || p != prio)) continue;
      req->demanded = true;
      streams[p] = true;
    }
  }
  // The chunks enqueued so far; the dispatcher demands the later ones (it reads `demanded`
  // after enqueueing, under demand_mu_).
  absl::MutexLock lock(&demand_mu_);
  for (int p = 0; p < kNumPriorities; ++p) {
    if (streams[p]) streams_[p]->Demand();
  }
}

void CopyQueue::WaitStarted(CopyTicket t) {
  std::pair<CopyQueue*, CopyTicket> arg{this, t};
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::pair<CopyQueue*, CopyTicket>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        auto it = a->first->open_.find(a->second);
        return it == a->first->open_.end() || it->second->started;
      },
      &arg));
}

absl::Status CopyQueue::Wait(CopyTicket t) {
  absl::Status s;
  WaitUnlessStalled(t, absl::InfiniteDuration(), &s);  // no limit: returns once done
  return s;
}

bool CopyQueue::WaitUnlessStalled(CopyTicket t, absl::Duration stall_limit,
                                  absl::Status* status) {
  Demand(t);
  std::pair<CopyQueue*, CopyTicket> arg{this, t};
  const absl::Condition done(
      +[](std::pair<CopyQueue*, CopyTicket>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return a->second == 0 ? a->first->open_.empty() : a->first->open_.count(a->second) == 0;
      },
      &arg);
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  for (;;) {
    const absl::Time limit = std::max(start, last_land_) + stall_limit;
    if (mu_.AwaitWithDeadline(done, limit)) break;
    if (std::max(start, last_land_) + stall_limit <= absl::Now()) return false;  // no landing
  }
  *status = status_;
  return true;
}

double CopyQueue::bandwidth() const {
  absl::MutexLock lock(&mu_);
  return busy_ns_ > 0 ? static_cast<double>(bytes_) * 1e9 / static_cast<double>(busy_ns_) : 0.0;
}

uint64_t CopyQueue::bytes_copied() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

std::shared_ptr<CopyQueue::Request> CopyQueue::NextChunkSource() {
  for (auto& queue : pending_) {
    if (queue.empty()) continue;
    std::shared_ptr<Request> req = queue.front();
    if (req->next_offset + chunk_bytes_ >= req->r.bytes) queue.pop_front();  // its last chunk
    return req;
  }
  return nullptr;
}

void CopyQueue::Run() {
  EnterRole(ThreadRole::kCopy);
  std::deque<InFlight> inflight;
  int64_t last_land_us = 0;
  for (;;) {
    std::shared_ptr<Request> req;
    size_t offset = 0, n = 0;
    {
      absl::MutexLock lock(&mu_);
      if (inflight.empty()) {
        mu_.Await(absl::Condition(
            +[](CopyQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return q->stop_ || !q->pending_[0].empty() || !q->pending_[1].empty();
            },
            this));
        if (pending_[0].empty() && pending_[1].empty()) return;  // stopping, drained
      }
      if (static_cast<int>(inflight.size()) < depth_) {
        req = NextChunkSource();
        if (req != nullptr) {
          offset = req->next_offset;
          n = std::min(chunk_bytes_, req->r.bytes - offset);
          req->next_offset += n;
        }
      }
    }
    if (req != nullptr) {
      void* dst = req->r.dst(offset, n);
      const char* src = static_cast<const char*>(req->r.src) + offset;
      CopyStream* stream = streams_[static_cast<int>(req->r.priority)].get();
      absl::Status s = absl::OkStatus();
      if (offset == 0 && req->r.after != nullptr) s = stream->WaitForEvent(req->r.after.get());
      {
        absl::MutexLock lock(&demand_mu_);
        if (s.ok()) s = stream->CopyToHost(dst, src, n);
        if (s.ok() && req->demanded) stream->Demand();
      }
      absl::StatusOr<std::unique_ptr<CopyEvent>> ev =
          s.ok() ? stream->RecordEvent() : absl::StatusOr<std::unique_ptr<CopyEvent>>(s);
      if (ev.ok() && req->r.test_consume_before_landing && req->r.on_chunk) {
        req->r.on_chunk(offset, n, dst);
      }
      if (ev.ok()) {
        absl::MutexLock lock(&mu_);
        req->started = true;
      }
      if (!ev.ok()) {
        absl::MutexLock lock(&mu_);
        if (status_.ok()) status_ = Annotate(ev.status(), "device-to-host copy");
        for (auto& q : pending_) q.clear();
        open_.clear();
        continue;
      }
      inflight.push_back({req, offset, n, dst, std::move(ev).value(),
                          trace_ ? trace_->NowMicros() : MonotonicNanos() / 1000});
      continue;
    }
    InFlight& f = inflight.front();
    Land(&f);
    int64_t now_us = trace_ ? trace_->NowMicros() : MonotonicNanos() / 1000;
    int64_t start_us = std::max(f.submit_us, last_land_us);
    last_land_us = now_us;
    if (trace_) {
      trace_->Complete("copy", f.req->r.label, start_us, now_us - start_us,
                       absl::StrCat("{\"bytes\":", f.n, "}"));
    }
    absl::MutexLock lock(&mu_);
    bytes_ += f.n;
    busy_ns_ += (now_us - start_us) * 1000;
    last_land_ = absl::Now();
    if (--f.req->chunks_left == 0) open_.erase(f.req->ticket);
    inflight.pop_front();
  }
}

void CopyQueue::Land(InFlight* f) {
  absl::Status s = f->event->Wait();
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = Annotate(s, "device-to-host copy");
    return;
  }
  if (f->req->r.on_chunk && !f->req->r.test_consume_before_landing) {
    f->req->r.on_chunk(f->offset, f->n, f->dst);
  }
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
