#include "trainer/resume.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/status.h"
#include "recovery/recovery_point.h"
#include "recovery/restore_state.h"
#include "recovery/state_source.h"
#include "trainer/model_config.h"
#include "trainer/wire.h"

namespace gradsnap {
namespace trainer {
namespace {

// Message tags of the embedded multi-rank resume (rank 0 -> rank r over the training comm).
constexpr uint32_t kTagStatus = 0x7e501;
constexpr uint32_t kTagInfo = 0x7e502;
constexpr uint32_t kTagSlices = 0x7e503;

absl::Status Mismatch(const char* what, const std::string& a, const std::string& b,
                      const char* hint = "") {
  return absl::FailedPreconditionError(absl::StrCat("checkpoint does not match this run: ", what,
                                                    " is '", a, "' in the checkpoint, '", b,
                                                    "' in this run", hint));
}

// The replicated state of a checkpoint, checked against and adopted for this run.
absl::StatusOr<ReplicatedState> Adopt(const std::string& text, const ReplicatedState& run,
                                      bool allow_batch_change) {
  absl::StatusOr<ReplicatedState> s = ReplicatedState::Parse(text);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("not a gradsnap-train checkpoint (", s.status().message(), ")"));
  }
  RETURN_IF_ERROR(CheckCompatible(*s, run, allow_batch_change));
  s->world_size = run.world_size;
  s->global_batch = run.global_batch;
  s->param_layout = run.param_layout;
  return s;
}

// Checks the checkpoint `step` of `source` fits this run before any tensor is read.
absl::Status PreCheck(recovery::StateSource& source, int64_t step, const TrainStateView& view,
                      const ReplicatedState& run, bool allow_batch_change,
                      int32_t* saved_world_size) {
  ASSIGN_OR_RETURN(recovery::CheckpointView full, source.Describe(step));
  RETURN_IF_ERROR(Adopt(full.info.metadata, run, allow_batch_change).status());
  ASSIGN_OR_RETURN(uint64_t total, recovery::FlatTotal(full));
  if (total != view.flat_total) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint does not match this run: ", source.Name(), " step ", step,
                     " holds ", total, " parameters, this model has ", view.flat_total));
  }
  *saved_world_size = full.info.world_size;
  return absl::OkStatus();
}

void Report(const TrainStateView& view, const std::string& damage) {
  std::fprintf(stderr, "gradsnap-train: rank %d: damaged record skipped: %s\n", view.rank,
               damage.c_str());
  std::fflush(stderr);
}

void Take(const recovery::RestoredRange& r, ResumeOutcome* out) {
  out->full_step = r.full_step;
  out->deltas = r.deltas;
  out->fetch_ms += r.fetch_ms;
  out->replay_ms += r.replay_ms;
}

// --resume latest, every rank reading its own slice: agree on the FULL and the chain.
absl::Status AgreeOnLatest(recovery::StateSource& source, Comm& comm, const TrainOptions& o,
                           const TrainStateView& view, const ReplicatedState& run,
                           const std::vector<storage::CheckpointInfo>& list, float* master,
                           float* m, float* v, ResumeOutcome* out) {
  const int world = comm.world_size();
  recovery::RestoreOptions ro;
  int64_t max_full = -1;
  for (;;) {
    const recovery::RecoveryPoint rp = recovery::FindRecoveryPoint(list, max_full);
    if (rp.full_step < 0) {
      return absl::DataLossError(absl::StrCat("job ", o.ckpt.job,
                                              ": every FULL checkpoint is damaged; last: ",
                                              out->damage.empty() ? "?" : out->damage.back()));
    }
    // A FULL whose description is DATA_LOSS (a rank no node holds any more) is damage like a
    // bad chunk: RestoreRange reports it (full_damaged) and the ranks fall back together.
    absl::Status pre =
        PreCheck(source, rp.full_step, view, run, o.allow_batch_change, &out->saved_world_size);
    if (!pre.ok() && !absl::IsDataLoss(pre)) return pre;
    ASSIGN_OR_RETURN(recovery::RestoredRange r,
                     recovery::RestoreRange(source, rp, view.lo, view.hi, master, m, v, ro));
    if (!r.damage.empty()) {
      Report(view, r.damage);
      out->damage.push_back(r.damage);
    }
    // Per rank: FULL damaged, DELTAs replayed, and the FULL it chose (each rank lists the
    // store itself; nodes that disagree for a moment could give ranks different answers).
    std::vector<double> vals(3 * world, 0.0);
    vals[3 * view.rank] = r.full_damaged ? 1 : 0;
    vals[3 * view.rank + 1] = r.full_damaged ? 0 : r.deltas;
    vals[3 * view.rank + 2] = static_cast<double>(rp.full_step);
    RETURN_IF_ERROR(comm.AllReduceSum(vals.data(), vals.size()));
    for (int i = 0; i < world; ++i) {
      if (vals[3 * i + 2] != static_cast<double>(rp.full_step)) {
        return absl::UnavailableError(absl::StrCat(
            "job ", o.ckpt.job, ": rank ", i, " would resume from FULL step ",
            static_cast<int64_t>(vals[3 * i + 2]), ", rank ", view.rank, " from FULL step ",
            rp.full_step, " (the storage nodes disagree on what is committed); retry"));
      }
    }
    bool full_damaged = false;
    int k = static_cast<int>(rp.delta_steps.size());
    for (int i = 0; i < world; ++i) {
      full_damaged = full_damaged || vals[3 * i] != 0;
      k = std::min(k, static_cast<int>(vals[3 * i + 1]));
    }
    if (full_damaged) {  // some rank could not read this FULL: all take the previous one
      max_full = rp.full_step - 1;
      out->fetch_ms += r.fetch_ms;
      continue;
    }
    if (r.deltas > k) {  // another rank stopped earlier: restore again up to the same step
      out->fetch_ms += r.fetch_ms;
      out->replay_ms += r.replay_ms;
      ro.max_deltas = k;
      ASSIGN_OR_RETURN(r, recovery::RestoreRange(source, rp, view.lo, view.hi, master, m, v, ro));
      if (r.full_damaged || r.deltas != k) {
        return absl::DataLossError(absl::StrCat("job ", o.ckpt.job, ": step ", rp.full_step + k,
                                                " no longer reads back: ", r.damage));
      }
    }
    Take(r, out);
    ASSIGN_OR_RETURN(out->state, Adopt(r.state, run, o.allow_batch_change));
    return absl::OkStatus();
  }
}

// A given step (a FULL, or a DELTA replayed on its FULL), every rank reading its own slice.
absl::Status RestoreStep(recovery::StateSource& source, int64_t step, const TrainOptions& o,
                         const TrainStateView& view, const ReplicatedState& run,
                         const std::vector<storage::CheckpointInfo>& list, float* master, float* m,
                         float* v, ResumeOutcome* out) {
  ASSIGN_OR_RETURN(recovery::RecoveryPoint rp, recovery::PlanForStep(list, step));
  RETURN_IF_ERROR(
      PreCheck(source, rp.full_step, view, run, o.allow_batch_change, &out->saved_world_size));
  ASSIGN_OR_RETURN(recovery::RestoredRange r,
                   recovery::RestoreRange(source, rp, view.lo, view.hi, master, m, v,
                                          recovery::RestoreOptions()));
  if (r.full_damaged || r.step != step) {
    return absl::DataLossError(
        absl::StrCat(source.Name(), " step ", step, " cannot be restored: ", r.damage));
  }
  Take(r, out);
  ASSIGN_OR_RETURN(out->state, Adopt(r.state, run, o.allow_batch_change));
  return absl::OkStatus();
}

std::string InfoText(const ResumeOutcome& r) {
  return absl::StrCat(r.full_step, "\n", r.deltas, "\n", r.saved_world_size, "\n", r.newest_step,
                      "\n", r.fetch_ms, "\n", r.replay_ms, "\n", absl::StrJoin(r.damage, "\x1f"),
                      "\n", r.state.Serialize());
}

absl::Status ParseInfoText(const std::string& text, const ReplicatedState& run, bool allow,
                           ResumeOutcome* r) {
  std::vector<std::string> f = absl::StrSplit(text, absl::MaxSplits('\n', 7));
  int64_t ws = 0;
  if (f.size() != 8 || !absl::SimpleAtoi(f[0], &r->full_step) ||
      !absl::SimpleAtoi(f[1], &r->deltas) || !absl::SimpleAtoi(f[2], &ws) ||
      !absl::SimpleAtoi(f[3], &r->newest_step) || !absl::SimpleAtod(f[4], &r->fetch_ms) ||
      !absl::SimpleAtod(f[5], &r->replay_ms)) {
    return absl::DataLossError("malformed resume message from rank 0");
  }
  r->saved_world_size = static_cast<int32_t>(ws);
  if (!f[6].empty()) r->damage = absl::StrSplit(f[6], '\x1f');
  ASSIGN_OR_RETURN(r->state, Adopt(f[7], run, allow));
  return absl::OkStatus();
}

// Embedded store with several ranks: rank 0 restores everything and hands out the slices.
absl::Status FunnelRestore(recovery::StateSource* source, Comm& comm, const TrainOptions& o,
                           const TrainStateView& view, const ReplicatedState& run,
                           const std::vector<storage::CheckpointInfo>& list, int64_t step,
                           float* master, float* m, float* v, ResumeOutcome* out) {
  if (view.rank != 0) {
    ASSIGN_OR_RETURN(std::string st, RecvMessage(comm, 0, kTagStatus));
    RETURN_IF_ERROR(DecodeStatus(st));
    ASSIGN_OR_RETURN(std::string info, RecvMessage(comm, 0, kTagInfo));
    RETURN_IF_ERROR(ParseInfoText(info, run, o.allow_batch_change, out));
    ASSIGN_OR_RETURN(std::string slices, RecvMessage(comm, 0, kTagSlices));
    const size_t bytes = view.count() * sizeof(float);
    if (slices.size() != 3 * bytes) return absl::DataLossError("resume slices of the wrong size");
    std::memcpy(master, slices.data(), bytes);
    std::memcpy(m, slices.data() + bytes, bytes);
    std::memcpy(v, slices.data() + 2 * bytes, bytes);
    return absl::OkStatus();
  }
  const uint64_t total = view.flat_total;
  std::vector<float> all_p, all_m, all_v;
  absl::Status st = [&]() -> absl::Status {
    all_p.resize(total);
    all_m.resize(total);
    all_v.resize(total);
    if (step < 0) {  // latest, with fallback
      TrainStateView whole = view;
      whole.lo = 0;
      whole.hi = total;
      return AgreeOnLatest(*source, *NewLocalComm(), o, whole, run, list, all_p.data(),
                           all_m.data(), all_v.data(), out);
    }
    TrainStateView whole = view;
    whole.lo = 0;
    whole.hi = total;
    return RestoreStep(*source, step, o, whole, run, list, all_p.data(), all_m.data(), all_v.data(),
                       out);
  }();
  for (int r = 1; r < comm.world_size(); ++r) {
    RETURN_IF_ERROR(SendMessage(comm, r, kTagStatus, EncodeStatus(st)));
  }
  RETURN_IF_ERROR(st);
  const std::string info = InfoText(*out);
  for (int r = 0; r < comm.world_size(); ++r) {
    const RankSlice s = SliceOfRank(total, r, comm.world_size());
    const size_t bytes = s.size() * sizeof(float);
    if (r == 0) {
      std::memcpy(master, all_p.data() + s.lo, bytes);
      std::memcpy(m, all_m.data() + s.lo, bytes);
      std::memcpy(v, all_v.data() + s.lo, bytes);
      continue;
    }
    RETURN_IF_ERROR(SendMessage(comm, r, kTagInfo, info));
    std::string slices(3 * bytes, '\0');
    std::memcpy(slices.data(), all_p.data() + s.lo, bytes);
    std::memcpy(slices.data() + bytes, all_m.data() + s.lo, bytes);
    std::memcpy(slices.data() + 2 * bytes, all_v.data() + s.lo, bytes);
    RETURN_IF_ERROR(SendMessage(comm, r, kTagSlices, slices));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCompatible(const ReplicatedState& ckpt, const ReplicatedState& run,
                             bool allow_batch_change) {
  if (ckpt.model_config != run.model_config) {
    return Mismatch("model", ckpt.model_config, run.model_config);
  }
  if (ckpt.seq_len != run.seq_len) {
    return Mismatch("sequence length", absl::StrCat(ckpt.seq_len), absl::StrCat(run.seq_len));
  }
  if (ckpt.global_batch != run.global_batch && !allow_batch_change) {
    return Mismatch("global batch", absl::StrCat(ckpt.global_batch), absl::StrCat(run.global_batch),
                    " (pass --allow-batch-change to continue with another batch size; it "
                    "changes the data order)");
  }
  if (ckpt.data_fingerprint != run.data_fingerprint) {
    return Mismatch("data", ckpt.data_fingerprint, run.data_fingerprint);
  }
  return absl::OkStatus();
}

absl::Status RefuseFreshRunOfExistingJob(const std::string& job,
                                         const std::vector<storage::CheckpointInfo>& committed) {
  if (committed.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", job, " already has checkpoints (newest step ", committed.back().step,
      "); pass --resume latest to continue it or --job NAME for a new job"));
}

absl::Status CheckBeforeFencing(const TrainOptions& o, ShardStore* store,
                                const TrainStateView& view, const ReplicatedState& run) {
  if (store == nullptr || store->client() == nullptr) return absl::OkStatus();
  // Through the patient source: its calls wait out an outage of the store (up to 30 s), as
  // AcquireEpoch did when it came first.
  std::unique_ptr<recovery::StateSource> source = NewRestoreSource(*store, o.ckpt.job);
  ASSIGN_OR_RETURN(std::vector<storage::CheckpointInfo> list, source->List());
  if (o.resume.kind == ResumeKind::kNone) return RefuseFreshRunOfExistingJob(o.ckpt.job, list);
  recovery::RecoveryPoint rp;
  if (o.resume.kind == ResumeKind::kLatest) {
    rp = recovery::FindRecoveryPoint(list);
  } else {
    absl::StatusOr<recovery::RecoveryPoint> planned = recovery::PlanForStep(list, o.resume.step);
    if (!planned.ok()) return absl::OkStatus();  // the restore reports it
    rp = *planned;
  }
  if (rp.full_step < 0) return absl::OkStatus();
  int32_t saved_world_size = 0;
  absl::Status s = PreCheck(*source, rp.full_step, view, run, o.allow_batch_change,
                            &saved_world_size);
  // A record that does not read back is the restore's to skip or report, not a refusal.
  return absl::IsFailedPrecondition(s) ? s : absl::OkStatus();
}

absl::StatusOr<ResumeOutcome> RestoreRankState(const TrainOptions& o, ShardStore* store, Comm& comm,
                                               const TrainStateView& view,
                                               const ReplicatedState& run, float* master, float* m,
                                               float* v) {
  ResumeOutcome out;
  std::unique_ptr<recovery::StateSource> source;
  std::vector<storage::CheckpointInfo> list;
  const bool funnel = store != nullptr && !o.RemoteStore() && o.world_size > 1;
  if (store != nullptr && o.resume.kind != ResumeKind::kNone) {
    const Stopwatch listing;
    ASSIGN_OR_RETURN(list, store->ListCommitted(o.ckpt.job));  // collective
    out.list_ms = listing.ElapsedMillis();
    source = NewRestoreSource(*store, o.ckpt.job);
  }
  const int64_t step = o.resume.kind == ResumeKind::kStep ? o.resume.step : -1;  // -1: latest
  const recovery::RecoveryPoint newest = recovery::FindRecoveryPoint(list);
  const bool from_store = o.resume.kind != ResumeKind::kNone && (step >= 0 || newest.full_step >= 0);
  if (from_store) {
    out.source = absl::StrCat("job ", o.ckpt.job);
    out.newest_step = step >= 0 ? step : newest.step();
    if (funnel) {
      RETURN_IF_ERROR(
          FunnelRestore(source.get(), comm, o, view, run, list, step, master, m, v, &out));
    } else if (step >= 0) {
      RETURN_IF_ERROR(RestoreStep(*source, step, o, view, run, list, master, m, v, &out));
    } else {
      RETURN_IF_ERROR(AgreeOnLatest(*source, comm, o, view, run, list, master, m, v, &out));
    }
    out.resumed = true;
    return out;
  }
  if (o.init_from.empty()) return out;  // nothing to resume from: a fresh start
  ASSIGN_OR_RETURN(std::unique_ptr<recovery::StateSource> dir,
                   recovery::OpenDirSource(o.init_from));
  ASSIGN_OR_RETURN(std::vector<storage::CheckpointInfo> dir_list, dir->List());
  out.source = dir->Name();
  out.newest_step = dir_list.at(0).step;
  RETURN_IF_ERROR(
      RestoreStep(*dir, dir_list.at(0).step, o, view, run, dir_list, master, m, v, &out));
  out.resumed = true;
  return out;
}

}  // namespace trainer
}  // namespace gradsnap
