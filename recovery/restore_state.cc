#include "recovery/restore_state.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "gpu_snapshot/grad_log.h"
#include "gpu_snapshot/host_replay.h"
#include "recovery/state_text.h"

namespace gradsnap {
namespace recovery {
namespace {

// One ranged read into caller memory; `group` says which record it belongs to.
struct ReadTask {
  int64_t step = 0;
  int32_t rank = 0;
  const std::string* tensor = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  char* out = nullptr;
  size_t group = 0;
};

// The tensor every DELTA shard's header is read from.
const std::string& DeltaHeaderName() {
  static const std::string* name = new std::string(kDeltaHeaderTensor);
  return *name;
}

// Ranged reads run by up to `threads` threads as they are added. Finish returns each group's
// error: DATA_LOSS preferred, then the one of the read added first (so a damaged chunk that a
// DELTA's header and gradient share is reported under the header, whichever read failed first);
// callers stop at the first failed group.
// The destructor waits for the reads in flight (they write into the caller's buffers).
class ReadRunner {
 public:
  ReadRunner(StateSource& source, int threads) : source_(source), threads_(std::max(1, threads)) {}
  ~ReadRunner() { Finish(0); }

  void Add(const std::vector<ReadTask>& tasks) {
    absl::MutexLock lock(&mu_);
    for (const ReadTask& t : tasks) {
      queue_.push_back({added_++, t});
      if (status_.size() <= t.group) {
        status_.resize(t.group + 1);
        failed_at_.resize(t.group + 1, SIZE_MAX);
      }
    }
    while (workers_.size() < std::min<size_t>(threads_, added_)) {
      workers_.emplace_back([this] { Work(); });
    }
  }

  std::vector<absl::Status> Finish(size_t groups) {
    std::vector<std::thread> workers;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      workers.swap(workers_);
    }
    for (std::thread& t : workers) t.join();
    absl::MutexLock lock(&mu_);
    std::vector<absl::Status> out = status_;
    out.resize(std::max(groups, out.size()));
    return out;
  }

 private:
  bool HasWorkOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !queue_.empty();
  }
  void Work() {
    for (;;) {
      size_t order = 0;
      ReadTask t;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &ReadRunner::HasWorkOrClosed));
        if (queue_.empty()) return;
        std::tie(order, t) = queue_.front();
        queue_.pop_front();
      }
      absl::Status s = source_.Read(t.step, t.rank, *t.tensor, t.offset, t.length, t.out);
      if (s.ok()) continue;
      absl::MutexLock lock(&mu_);
      absl::Status& g = status_[t.group];
      const bool loss = absl::IsDataLoss(s), had_loss = absl::IsDataLoss(g);
      if (g.ok() || (loss && !had_loss) || (loss == had_loss && order < failed_at_[t.group])) {
        g = s;
        failed_at_[t.group] = order;
      }
    }
  }

  StateSource& source_;
  const size_t threads_;
  absl::Mutex mu_;
  std::deque<std::pair<size_t, ReadTask>> queue_ ABSL_GUARDED_BY(mu_);  // (order added, read)
  std::vector<absl::Status> status_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> failed_at_ ABSL_GUARDED_BY(mu_);  // order of the read status_ reports
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  size_t added_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// Whether two headers describe the same update (they differ only in their slice).
bool SameUpdate(gpu_snapshot::DeltaHeader a, gpu_snapshot::DeltaHeader b) {
  a.numel = b.numel = 0;
  a.elem_offset = b.elem_offset = 0;
  return gpu_snapshot::EncodeDeltaHeader(a) == gpu_snapshot::EncodeDeltaHeader(b);
}

absl::StatusOr<int64_t> StateStep(const std::string& text) {
  ASSIGN_OR_RETURN(auto kv, ParseStateText(text));
  return StateInt(kv, "step");
}

// Appends the reads of elements [lo, hi) of flat buffer `flat` of `view` into out (element size
// of the pieces' dtype, returned in *dtype). DATA_LOSS when the pieces do not cover the range.
// `out` holds (hi - lo) elements of `max_elem_bytes` (0: sized for the pieces' dtype): pieces of
// a wider dtype are FAILED_PRECONDITION before any read is planned, so none writes past it.
absl::Status PlanFlat(StateSource& source, const CheckpointView& view, const std::string& flat,
                      uint64_t lo, uint64_t hi, void* out, size_t max_elem_bytes, DType* dtype,
                      const RestoreOptions& o, size_t group, uint64_t* bytes,
                      std::vector<ReadTask>* tasks) {
  const FlatBuffer* f = view.Flat(flat);
  if (f == nullptr || hi > f->total || lo > hi) {
    return absl::DataLossError(absl::StrCat(source.Name(), " step ", view.info.step,
                                            ": no elements [", lo, ", ", hi, ") of ", flat));
  }
  uint64_t covered = lo;
  bool typed = false;
  for (const FlatPiece& p : f->pieces) {
    const uint64_t b = std::max(lo, p.flat_offset), e = std::min(hi, p.flat_offset + p.count);
    if (b >= e) continue;
    if (b != covered || (typed && p.dtype != *dtype)) break;
    *dtype = p.dtype;
    typed = true;
    const uint64_t es = DTypeSize(p.dtype);
    if (max_elem_bytes != 0 && es > max_elem_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          source.Name(), " step ", view.info.step, ": ", flat, " is ", DTypeName(p.dtype),
          ", not f32 (training state is restored as f32)"));
    }
    char* dst = static_cast<char*>(out) + (b - lo) * es;
    uint64_t off = (p.first + b - p.flat_offset) * es;
    // Ranges end on multiples of range_bytes from the tensor's start (and on elements).
    const uint64_t step = std::max<uint64_t>(o.range_bytes / es, 1) * es;
    for (uint64_t left = (e - b) * es; left > 0;) {
      const uint64_t n = std::min(left, step - off % step);
      tasks->push_back(ReadTask{view.info.step, p.rank, &p.tensor, off, n, dst, group});
      off += n;
      dst += n;
      left -= n;
      *bytes += n;
    }
    covered = e;
  }
  if (covered != hi) {
    return absl::DataLossError(absl::StrCat(source.Name(), " step ", view.info.step, ": ", flat,
                                            " does not hold elements [", covered, ", ", hi,
                                            ") in one dtype"));
  }
  if (!typed) *dtype = DType::kF32;
  return absl::OkStatus();
}

// A DELTA of the chain: described, its gradient slice and the headers of the shards that hold
// it read (all as ranged reads beside the FULL's), then the headers checked before it is replayed.
struct DeltaPlan {
  int64_t step = 0;
  CheckpointView view;
  bool have_update = false;  // false when [lo, hi) is empty
  gpu_snapshot::DeltaHeader update;
  DType dtype = DType::kF32;
  std::unique_ptr<char[]> grad;
  std::vector<const FlatPiece*> pieces;        // the grad pieces overlapping [lo, hi)
  std::vector<std::unique_ptr<char[]>> headers;  // their shards' headers, as read
};

// Describes DELTA u and checks it is one on FULL full_step carrying its own step's state.
// DATA_LOSS: the record is damaged or inconsistent.
absl::Status DescribeDelta(StateSource& source, int64_t full_step, int64_t u, DeltaPlan* d) {
  d->step = u;
  ASSIGN_OR_RETURN(d->view, source.Describe(u));
  if (d->view.info.kind != storage::CheckpointKind::kDelta || d->view.info.base_step != full_step ||
      d->view.Flat(kFlatGrad) == nullptr) {
    return absl::DataLossError(
        absl::StrCat(source.Name(), " step ", u, ": not a DELTA on FULL ", full_step));
  }
  ASSIGN_OR_RETURN(int64_t state_step, StateStep(d->view.info.metadata));
  if (state_step != u) {
    return absl::DataLossError(
        absl::StrCat(source.Name(), " DELTA ", u, " carries the state of step ", state_step));
  }
  return absl::OkStatus();
}

// Plans the reads of a described DELTA's gradient slice [lo, hi) and of the headers of the
// shards holding it, in `group`. Appends to *tasks and *bytes only when all of it is planned (a
// failed plan's buffers go with it: no read may be left pointing into them).
absl::Status PlanDelta(StateSource& source, uint64_t lo, uint64_t hi, const RestoreOptions& o,
                       size_t group, DeltaPlan* d, uint64_t* bytes, std::vector<ReadTask>* tasks) {
  const FlatBuffer* grad = d->view.Flat(kFlatGrad);
  DType dtype = DType::kF32;
  std::vector<ReadTask> planned;
  for (const FlatPiece& p : grad->pieces) {
    if (p.flat_offset >= hi || p.flat_offset + p.count <= lo) continue;
    if (d->pieces.empty()) dtype = p.dtype;
    d->pieces.push_back(&p);
    d->headers.push_back(std::make_unique<char[]>(gpu_snapshot::kDeltaHeaderBytes));
    planned.push_back(ReadTask{d->step, p.rank, &DeltaHeaderName(), 0,
                               gpu_snapshot::kDeltaHeaderBytes, d->headers.back().get(), group});
  }
  d->grad = std::make_unique<char[]>(std::max<uint64_t>((hi - lo) * DTypeSize(dtype), 1));
  uint64_t planned_bytes = 0;
  RETURN_IF_ERROR(PlanFlat(source, d->view, kFlatGrad, lo, hi, d->grad.get(), /*max_elem_bytes=*/0,
                           &d->dtype, o, group, &planned_bytes, &planned));
  tasks->insert(tasks->end(), planned.begin(), planned.end());
  *bytes += planned_bytes;
  return absl::OkStatus();
}

// Checks the headers PlanDelta had read: each names this DELTA, its FULL and its shard's slice,
// and all describe the same update (kept in d->update). DATA_LOSS otherwise.
absl::Status CheckDeltaHeaders(StateSource& source, int64_t full_step, DeltaPlan* d) {
  for (size_t i = 0; i < d->pieces.size(); ++i) {
    const FlatPiece& p = *d->pieces[i];
    absl::StatusOr<gpu_snapshot::DeltaHeader> h = gpu_snapshot::DecodeDeltaHeader(
        std::string(d->headers[i].get(), gpu_snapshot::kDeltaHeaderBytes));
    if (!h.ok() || h->step != d->step || h->base_step != full_step || h->numel != p.count ||
        h->elem_offset != p.flat_offset || h->grad_dtype != p.dtype ||
        (d->have_update && !SameUpdate(*h, d->update))) {
      return absl::DataLossError(
          absl::StrCat(source.Name(), " step ", d->step, " rank ", p.rank, " tensor ",
                       kDeltaHeaderTensor, ": does not match its checkpoint",
                       h.ok() ? "" : absl::StrCat(" (", h.status().message(), ")")));
    }
    d->update = *h;
    d->have_update = true;
  }
  return absl::OkStatus();
}

constexpr size_t kDescribeThreads = 16;

// Describes DELTAs rp.delta_steps[next, next + count) at once, on up to kDescribeThreads
// threads (each a round trip to the store), while the caller's thread runs `meanwhile` (if
// any). Fills *plans and returns each one's DescribeDelta status.
std::vector<absl::Status> DescribeDeltas(StateSource& source, const RecoveryPoint& rp, size_t next,
                                         size_t count,
                                         std::vector<std::unique_ptr<DeltaPlan>>* plans,
                                         const std::function<void()>& meanwhile) {
  plans->clear();
  std::vector<absl::Status> status(count);
  for (size_t k = 0; k < count; ++k) plans->push_back(std::make_unique<DeltaPlan>());
  // At most kDescribeThreads descriptions at once (a batch may hold 64 DELTAs).
  ForEachConcurrently(
      count, kDescribeThreads,
      [&](size_t k) {
        status[k] =
            DescribeDelta(source, rp.full_step, rp.delta_steps[next + k], (*plans)[k].get());
      },
      meanwhile);
  return status;
}

}  // namespace

absl::StatusOr<uint64_t> FlatTotal(const CheckpointView& full) {
  const FlatBuffer* p = full.Flat(kFlatParams);
  const FlatBuffer* m = full.Flat(kFlatAdamM);
  const FlatBuffer* v = full.Flat(kFlatAdamV);
  if (p == nullptr || m == nullptr || v == nullptr || p->total != m->total ||
      p->total != v->total) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", full.info.step,
                     " is not a gradsnap-train FULL checkpoint (no params/adam_m/adam_v slices)"));
  }
  return p->total;
}

absl::StatusOr<RestoredRange> RestoreRange(StateSource& source, const RecoveryPoint& rp,
                                           uint64_t lo, uint64_t hi, float* master, float* m,
                                           float* v, const RestoreOptions& o) {
  RestoredRange r;
  r.full_step = rp.full_step;
  r.step = rp.full_step;
  Stopwatch fetch;
  // The FULL and the first batch of DELTAs are described at once (round trips), then all their
  // reads go out together: the FULL's slices, each DELTA's gradient slice and the headers of its
  // shards (checked once in, before the DELTA is replayed). The rest of the chain comes in
  // batches of prefetch_deltas, each replayed once it is in.
  size_t chain = rp.delta_steps.size();
  if (o.max_deltas >= 0) chain = std::min<size_t>(chain, static_cast<size_t>(o.max_deltas));
  const size_t batch =
      o.prefetch_deltas > 0
          ? static_cast<size_t>(o.prefetch_deltas)
          : std::clamp<size_t>(o.prefetch_bytes / std::max<uint64_t>(1, (hi - lo) * sizeof(float)),
                               4, 64);
  std::vector<std::unique_ptr<DeltaPlan>> described;
  absl::StatusOr<CheckpointView> full = absl::UnknownError("not described");
  std::vector<absl::Status> described_status =
      DescribeDeltas(source, rp, 0, std::min(batch, chain), &described,
                     [&] { full = source.Describe(rp.full_step); });
  std::vector<ReadTask> tasks;
  DType dts[3] = {DType::kF32, DType::kF32, DType::kF32};
  absl::Status s = full.status();
  if (s.ok()) {
    ASSIGN_OR_RETURN(uint64_t total, FlatTotal(*full));
    if (hi > total || lo > hi) {
      return absl::FailedPreconditionError(absl::StrCat(source.Name(), " step ", rp.full_step,
                                                        " has ", total, " elements, asked for [",
                                                        lo, ", ", hi, ")"));
    }
    r.state = full->info.metadata;
    absl::StatusOr<int64_t> state_step = StateStep(r.state);
    if (!state_step.ok() || *state_step != rp.full_step) {
      s = absl::DataLossError(absl::StrCat(source.Name(), " FULL ", rp.full_step,
                                           ": its train state is missing or of another step"));
    }
    float* bufs[3] = {master, m, v};
    const char* names[3] = {kFlatParams, kFlatAdamM, kFlatAdamV};
    for (int i = 0; i < 3 && s.ok(); ++i) {
      s = PlanFlat(source, *full, names[i], lo, hi, bufs[i], sizeof(float), &dts[i], o, 0,
                   &r.bytes_read, &tasks);
    }
  }
  if (!s.ok() && !absl::IsDataLoss(s)) return s;
  gpu_snapshot::ReplayPool pool(std::max(1, std::min(o.threads, 4)));
  const gpu_snapshot::HostStateRef state{master, m, v, static_cast<size_t>(hi - lo)};
  bool first_batch = true;
  for (size_t next = 0; s.ok() && (first_batch || next < chain);) {
    if (!first_batch) {
      described_status =
          DescribeDeltas(source, rp, next, std::min(batch, chain - next), &described, nullptr);
    }
    // Plan this batch: group 0 is the FULL (first batch only), group k the k-th DELTA.
    std::vector<std::unique_ptr<DeltaPlan>> plans;
    absl::Status stop;  // a DELTA that could not even be planned ends the chain there
    for (size_t k = 0; k < described.size(); ++k) {
      stop = described_status[k];
      if (stop.ok()) {
        stop = PlanDelta(source, lo, hi, o, plans.size() + 1, described[k].get(), &r.bytes_read,
                         &tasks);
      }
      if (!stop.ok()) break;
      plans.push_back(std::move(described[k]));
      ++next;
    }
    described.clear();
    if (!stop.ok() && !absl::IsDataLoss(stop)) return stop;
    std::vector<absl::Status> st;
    {
      ReadRunner runner(source, o.threads);
      runner.Add(tasks);
      tasks.clear();
      st = runner.Finish(plans.size() + 1);
    }
    if (first_batch) {
      first_batch = false;
      for (int i = 0; i < 3 && st[0].ok(); ++i) {
        if (dts[i] != DType::kF32) {
          return absl::FailedPreconditionError(absl::StrCat(
              source.Name(), " step ", rp.full_step, ": a flat buffer is ", DTypeName(dts[i]),
              ", not f32 (a bf16 export cannot continue training exactly)"));
        }
      }
      if (!st[0].ok()) {
        if (!absl::IsDataLoss(st[0])) return st[0];
        r.fetch_ms = fetch.ElapsedMillis();
        r.full_damaged = true;
        r.damage = std::string(st[0].message());
        return r;
      }
    }
    r.fetch_ms += fetch.ElapsedMillis();
    Stopwatch replay;
    // The DELTAs that read back and check, in order, replayed in one pass over the state.
    std::vector<gpu_snapshot::ReplayPool::ChainStep> steps;
    for (size_t k = 0; k < plans.size(); ++k) {
      if (!st[k + 1].ok()) {
        if (!absl::IsDataLoss(st[k + 1])) return st[k + 1];
        stop = st[k + 1];
        break;
      }
      DeltaPlan& d = *plans[k];
      if (absl::Status h = CheckDeltaHeaders(source, rp.full_step, &d); !h.ok()) {
        stop = h;
        break;
      }
      if (d.have_update && hi > lo) steps.push_back({d.grad.get(), d.dtype, d.update.update});
      r.state = d.view.info.metadata;
      r.step = d.step;
      ++r.deltas;
    }
    if (!steps.empty()) pool.ApplyChain(state, 0, hi - lo, steps);
    r.replay_ms += replay.ElapsedMillis();
    fetch = Stopwatch();
    if (!stop.ok()) {
      r.damage = std::string(stop.message());
      break;
    }
  }
  if (absl::IsDataLoss(s)) {  // the FULL's description itself
    r.full_damaged = true;
    r.damage = std::string(s.message());
  }
  return r;
}

absl::Status NoUndamagedFullError(const StateSource& source, const std::string& last_damage) {
  return absl::DataLossError(
      absl::StrCat(source.Name(), " has no undamaged committed FULL checkpoint",
                   last_damage.empty() ? "" : absl::StrCat(" (", last_damage, ")")));
}

absl::StatusOr<RestoredRange> RestoreRecoveryPoint(StateSource& source, uint64_t lo, uint64_t hi,
                                                   float* master, float* m, float* v,
                                                   const RestoreOptions& o,
                                                   std::vector<std::string>* damage,
                                                   int64_t max_full) {
  ASSIGN_OR_RETURN(std::vector<storage::CheckpointInfo> list, source.List());
  for (bool first = true;; first = false) {
    const RecoveryPoint rp = FindRecoveryPoint(list, max_full);
    if (rp.full_step < 0 && first && max_full < 0) {
      return absl::NotFoundError(absl::StrCat(source.Name(), " has no committed FULL checkpoint"));
    }
    if (rp.full_step < 0) {  // FULLs there are, every one damaged: not "nothing to resume"
      return NoUndamagedFullError(source, damage->empty() ? "" : damage->back());
    }
    ASSIGN_OR_RETURN(RestoredRange r, RestoreRange(source, rp, lo, hi, master, m, v, o));
    if (!r.damage.empty()) damage->push_back(r.damage);
    if (!r.full_damaged) return r;
    max_full = rp.full_step - 1;
  }
}

}  // namespace recovery
}  // namespace gradsnap
