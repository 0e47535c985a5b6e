#include "recovery/restore_state.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "gpu_snapshot/grad_log.h"
#include "gpu_snapshot/host_replay.h"
#include "recovery/state_text.h"

namespace gradsnap {
namespace recovery {
namespace {

// One ranged read into caller memory; `group` says which record it belongs to.
struct ReadTask {
  int64_t step;
  int32_t rank;
  const std::string* tensor;
  uint64_t offset;
  uint64_t length;
  char* out;
  size_t group;
};

// Runs the reads on up to `threads` threads. Returns each group's first error (DATA_LOSS
// preferred); a group after a failed one may be left unread (OK is then not meaningful for it,
// callers stop at the first failed group).
std::vector<absl::Status> RunReads(StateSource& source, const std::vector<ReadTask>& tasks,
                                   size_t groups, int threads) {
  std::vector<absl::Status> status(groups);
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  auto worker = [&] {
    for (size_t i = next++; i < tasks.size(); i = next++) {
      const ReadTask& t = tasks[i];
      absl::Status s = source.Read(t.step, t.rank, *t.tensor, t.offset, t.length, t.out);
      if (s.ok()) continue;
      absl::MutexLock lock(&mu);
      absl::Status& g = status[t.group];
      if (g.ok() || (absl::IsDataLoss(s) && !absl::IsDataLoss(g))) g = s;
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(tasks.size())));
  std::vector<std::thread> pool;
  for (int i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return status;
}

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
absl::Status PlanFlat(StateSource& source, const CheckpointView& view, const std::string& flat,
                      uint64_t lo, uint64_t hi, void* out, DType* dtype, const RestoreOptions& o,
                      size_t group, uint64_t* bytes, std::vector<ReadTask>* tasks) {
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

// A DELTA of the chain, checked and with its gradient reads planned.
struct DeltaPlan {
  int64_t step = 0;
  CheckpointView view;
  bool have_update = false;  // false when [lo, hi) is empty
  gpu_snapshot::DeltaHeader update;
  DType dtype = DType::kF32;
  std::unique_ptr<char[]> grad;
};

// Describes DELTA u, reads and checks the headers of the shards overlapping [lo, hi) and plans
// the reads of its gradient slice. DATA_LOSS: the record is damaged or inconsistent.
absl::Status PrepareDelta(StateSource& source, int64_t full_step, int64_t u, uint64_t lo,
                          uint64_t hi, const RestoreOptions& o, size_t group, DeltaPlan* d,
                          uint64_t* bytes, std::vector<ReadTask>* tasks) {
  d->step = u;
  ASSIGN_OR_RETURN(d->view, source.Describe(u));
  const FlatBuffer* grad = d->view.Flat(kFlatGrad);
  if (d->view.info.kind != storage::CheckpointKind::kDelta || d->view.info.base_step != full_step ||
      grad == nullptr) {
    return absl::DataLossError(
        absl::StrCat(source.Name(), " step ", u, ": not a DELTA on FULL ", full_step));
  }
  ASSIGN_OR_RETURN(int64_t state_step, StateStep(d->view.info.metadata));
  if (state_step != u) {
    return absl::DataLossError(
        absl::StrCat(source.Name(), " DELTA ", u, " carries the state of step ", state_step));
  }
  for (const FlatPiece& p : grad->pieces) {
    if (p.flat_offset >= hi || p.flat_offset + p.count <= lo) continue;
    std::string bytes_h(gpu_snapshot::kDeltaHeaderBytes, '\0');
    RETURN_IF_ERROR(source.Read(u, p.rank, kDeltaHeaderTensor, 0, bytes_h.size(), bytes_h.data()));
    absl::StatusOr<gpu_snapshot::DeltaHeader> h = gpu_snapshot::DecodeDeltaHeader(bytes_h);
    if (!h.ok() || h->step != u || h->base_step != full_step || h->numel != p.count ||
        h->elem_offset != p.flat_offset || h->grad_dtype != p.dtype ||
        (d->have_update && !SameUpdate(*h, d->update))) {
      return absl::DataLossError(
          absl::StrCat(source.Name(), " step ", u, " rank ", p.rank, " tensor ", kDeltaHeaderTensor,
                       ": does not match its checkpoint",
                       h.ok() ? "" : absl::StrCat(" (", h.status().message(), ")")));
    }
    d->update = *h;
    d->have_update = true;
  }
  const size_t es = DTypeSize(d->have_update ? d->update.grad_dtype : DType::kF32);
  d->grad = std::make_unique<char[]>(std::max<uint64_t>((hi - lo) * es, 1));
  return PlanFlat(source, d->view, kFlatGrad, lo, hi, d->grad.get(), &d->dtype, o, group, bytes,
                  tasks);
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
  // The FULL's slices and the first DELTAs' gradients are fetched together, in parallel; the
  // rest of the chain in batches of prefetch_deltas, each replayed once it is in.
  std::vector<ReadTask> tasks;
  DType dts[3] = {DType::kF32, DType::kF32, DType::kF32};
  absl::StatusOr<CheckpointView> full = source.Describe(rp.full_step);
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
      s = PlanFlat(source, *full, names[i], lo, hi, bufs[i], &dts[i], o, 0, &r.bytes_read, &tasks);
    }
  }
  if (!s.ok() && !absl::IsDataLoss(s)) return s;
  size_t chain = rp.delta_steps.size();
  if (o.max_deltas >= 0) chain = std::min<size_t>(chain, static_cast<size_t>(o.max_deltas));
  const size_t batch = static_cast<size_t>(std::max(1, o.prefetch_deltas));
  gpu_snapshot::ReplayPool pool(std::max(1, std::min(o.threads, 4)));
  const gpu_snapshot::HostStateRef state{master, m, v, static_cast<size_t>(hi - lo)};
  bool first_batch = true;
  for (size_t next = 0; s.ok() && (first_batch || next < chain);) {
    // Plan this batch: group 0 is the FULL (first batch only), group k the k-th DELTA.
    std::vector<std::unique_ptr<DeltaPlan>> plans;
    absl::Status stop;  // a DELTA that could not even be planned ends the chain there
    while (next < chain && plans.size() < batch) {
      auto d = std::make_unique<DeltaPlan>();
      stop = PrepareDelta(source, rp.full_step, rp.delta_steps[next], lo, hi, o, plans.size() + 1,
                          d.get(), &r.bytes_read, &tasks);
      if (!stop.ok()) break;
      plans.push_back(std::move(d));
      ++next;
    }
    if (!stop.ok() && !absl::IsDataLoss(stop)) return stop;
    std::vector<absl::Status> st = RunReads(source, tasks, plans.size() + 1, o.threads);
    tasks.clear();
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
    for (size_t k = 0; k < plans.size(); ++k) {
      if (!st[k + 1].ok()) {
        if (!absl::IsDataLoss(st[k + 1])) return st[k + 1];
        stop = st[k + 1];
        break;
      }
      DeltaPlan& d = *plans[k];
      if (d.have_update && hi > lo) {
        pool.Apply(state, 0, hi - lo, d.grad.get(), d.dtype, d.update.update);
      }
      r.state = d.view.info.metadata;
      r.step = d.step;
      ++r.deltas;
    }
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

absl::StatusOr<RestoredRange> RestoreRecoveryPoint(StateSource& source, uint64_t lo, uint64_t hi,
                                                   float* master, float* m, float* v,
                                                   const RestoreOptions& o,
                                                   std::vector<std::string>* damage) {
  ASSIGN_OR_RETURN(std::vector<storage::CheckpointInfo> list, source.List());
  int64_t max_full = -1;
  for (;;) {
    const RecoveryPoint rp = FindRecoveryPoint(list, max_full);
    if (rp.full_step < 0) {
      return absl::NotFoundError(absl::StrCat(
          source.Name(), " has no ", max_full < 0 ? "" : "undamaged ", "committed FULL checkpoint",
          damage->empty() ? "" : absl::StrCat(" (", damage->back(), ")")));
    }
    ASSIGN_OR_RETURN(RestoredRange r, RestoreRange(source, rp, lo, hi, master, m, v, o));
    if (!r.damage.empty()) damage->push_back(r.damage);
    if (!r.full_damaged) return r;
    max_full = rp.full_step - 1;
  }
}

}  // namespace recovery
}  // namespace gradsnap
