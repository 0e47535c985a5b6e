#include "recovery/restore_state.h"

#include <algorithm>
#include <atomic>
#include <cstring>
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

struct ReadTask {
  int32_t rank;
  const std::string* tensor;
  uint64_t offset;
  uint64_t length;
  char* out;
};

// Runs the reads on up to `threads` threads; the first error (DATA_LOSS preferred) wins.
absl::Status RunReads(StateSource& source, int64_t step, const std::vector<ReadTask>& tasks,
                      int threads) {
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  absl::Status first;
  auto worker = [&] {
    for (size_t i = next++; i < tasks.size(); i = next++) {
      const ReadTask& t = tasks[i];
      absl::Status s = source.Read(step, t.rank, *t.tensor, t.offset, t.length, t.out);
      if (s.ok()) continue;
      absl::MutexLock lock(&mu);
      if (first.ok() || (s.code() == absl::StatusCode::kDataLoss &&
                         first.code() != absl::StatusCode::kDataLoss)) {
        first = s;
      }
      next = tasks.size();  // stop the others early
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(tasks.size())));
  std::vector<std::thread> pool;
  for (int i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return first;
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

// Reads and replays DELTA u over [lo, hi). DATA_LOSS: damaged (nothing applied).
absl::Status ReplayDelta(StateSource& source, int64_t full_step, int64_t u, uint64_t lo,
                         uint64_t hi, const gpu_snapshot::HostStateRef& state,
                         gpu_snapshot::ReplayPool* pool, const RestoreOptions& o,
                         RestoredRange* r) {
  Stopwatch fetch;
  ASSIGN_OR_RETURN(CheckpointView view, source.Describe(u));
  const FlatBuffer* grad = view.Flat(kFlatGrad);
  if (view.info.kind != storage::CheckpointKind::kDelta || view.info.base_step != full_step ||
      grad == nullptr) {
    return absl::DataLossError(absl::StrCat(source.Name(), " step ", u,
                                            ": not a DELTA on FULL ", full_step));
  }
  ASSIGN_OR_RETURN(int64_t state_step, StateStep(view.info.metadata));
  if (state_step != u) {
    return absl::DataLossError(absl::StrCat(source.Name(), " DELTA ", u,
                                            " carries the state of step ", state_step));
  }
  // The header of every shard whose slice overlaps [lo, hi): same update, matching slice.
  bool have = false;
  gpu_snapshot::DeltaHeader update;
  for (const FlatPiece& p : grad->pieces) {
    if (p.flat_offset >= hi || p.flat_offset + p.count <= lo) continue;
    std::string bytes(gpu_snapshot::kDeltaHeaderBytes, '\0');
    RETURN_IF_ERROR(source.Read(u, p.rank, kDeltaHeaderTensor, 0, bytes.size(), bytes.data()));
    absl::StatusOr<gpu_snapshot::DeltaHeader> h = gpu_snapshot::DecodeDeltaHeader(bytes);
    if (!h.ok() || h->step != u || h->base_step != full_step || h->numel != p.count ||
        h->elem_offset != p.flat_offset || h->grad_dtype != p.dtype ||
        (have && !SameUpdate(*h, update))) {
      return absl::DataLossError(absl::StrCat(
          source.Name(), " step ", u, " rank ", p.rank, " tensor ", kDeltaHeaderTensor,
          ": does not match its checkpoint", h.ok() ? "" : absl::StrCat(" (", h.status().message(), ")")));
    }
    update = *h;
    have = true;
  }
  std::vector<char> g((hi - lo) * std::max<size_t>(DTypeSize(have ? update.grad_dtype
                                                                  : DType::kF32), 1));
  DType dtype = DType::kF32;
  RETURN_IF_ERROR(ReadFlat(source, view, kFlatGrad, lo, hi, g.data(), &dtype, o, &r->bytes_read));
  r->fetch_ms += fetch.ElapsedMillis();
  Stopwatch replay;
  if (have && hi > lo) pool->Apply(state, 0, hi - lo, g.data(), dtype, update.update);
  r->replay_ms += replay.ElapsedMillis();
  r->state = view.info.metadata;
  r->step = u;
  ++r->deltas;
  return absl::OkStatus();
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

absl::Status ReadFlat(StateSource& source, const CheckpointView& view, const std::string& flat,
                      uint64_t lo, uint64_t hi, void* out, DType* dtype,
                      const RestoreOptions& o, uint64_t* bytes_read) {
  const FlatBuffer* f = view.Flat(flat);
  if (f == nullptr || hi > f->total || lo > hi) {
    return absl::DataLossError(absl::StrCat(source.Name(), " step ", view.info.step,
                                            ": no elements [", lo, ", ", hi, ") of ", flat));
  }
  std::vector<ReadTask> tasks;
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
      tasks.push_back(ReadTask{p.rank, &p.tensor, off, n, dst});
      off += n;
      dst += n;
      left -= n;
      *bytes_read += n;
    }
    covered = e;
  }
  if (covered != hi) {
    return absl::DataLossError(absl::StrCat(source.Name(), " step ", view.info.step, ": ", flat,
                                            " does not hold elements [", covered, ", ", hi,
                                            ") in one dtype"));
  }
  if (!typed) *dtype = DType::kF32;
  return RunReads(source, view.info.step, tasks, o.threads);
}

absl::StatusOr<RestoredRange> RestoreRange(StateSource& source, const RecoveryPoint& rp,
                                           uint64_t lo, uint64_t hi, float* master, float* m,
                                           float* v, const RestoreOptions& o) {
  RestoredRange r;
  r.full_step = rp.full_step;
  r.step = rp.full_step;
  Stopwatch fetch;
  absl::StatusOr<CheckpointView> full = source.Describe(rp.full_step);
  absl::Status s = full.status();
  if (s.ok()) {
    ASSIGN_OR_RETURN(uint64_t total, FlatTotal(*full));
    if (hi > total || lo > hi) {
      return absl::FailedPreconditionError(absl::StrCat(
          source.Name(), " step ", rp.full_step, " has ", total, " elements, asked for [", lo,
          ", ", hi, ")"));
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
      DType dt;
      s = ReadFlat(source, *full, names[i], lo, hi, bufs[i], &dt, o, &r.bytes_read);
      if (s.ok() && dt != DType::kF32) {
        return absl::FailedPreconditionError(absl::StrCat(
            source.Name(), " step ", rp.full_step, ": ", names[i], " is ", DTypeName(dt),
            ", not f32 (a bf16 export cannot continue training exactly)"));
      }
    }
  }
  r.fetch_ms = fetch.ElapsedMillis();
  if (absl::IsDataLoss(s)) {
    r.full_damaged = true;
    r.damage = std::string(s.message());
    return r;
  }
  RETURN_IF_ERROR(s);
  gpu_snapshot::ReplayPool pool(std::max(1, std::min(o.threads, 4)));
  const gpu_snapshot::HostStateRef state{master, m, v, static_cast<size_t>(hi - lo)};
  for (int64_t u : rp.delta_steps) {
    if (o.max_deltas >= 0 && r.deltas >= o.max_deltas) break;
    absl::Status d = ReplayDelta(source, rp.full_step, u, lo, hi, state, &pool, o, &r);
    if (absl::IsDataLoss(d)) {
      r.damage = std::string(d.message());
      break;
    }
    RETURN_IF_ERROR(d);
  }
  return r;
}

absl::StatusOr<RestoredRange> RestoreRecoveryPoint(StateSource& source, uint64_t lo,
                                                   uint64_t hi, float* master, float* m,
                                                   float* v, const RestoreOptions& o,
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
