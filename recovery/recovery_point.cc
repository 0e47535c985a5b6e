#include "recovery/recovery_point.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace recovery {
namespace {

using storage::CheckpointInfo;
using storage::CheckpointKind;
using storage::CheckpointState;

// The committed checkpoints by step.
std::map<int64_t, const CheckpointInfo*> Committed(const std::vector<CheckpointInfo>& list) {
  std::map<int64_t, const CheckpointInfo*> out;
  for (const CheckpointInfo& c : list) {
    if (c.state == CheckpointState::kCommitted) out[c.step] = &c;
  }
  return out;
}

// Appends the DELTAs base+1, base+2, ... (at most up to `last`, when last >= 0).
void Chain(const std::map<int64_t, const CheckpointInfo*>& by_step, int64_t base, int64_t last,
           std::vector<int64_t>* out) {
  for (int64_t u = base + 1; last < 0 || u <= last; ++u) {
    auto it = by_step.find(u);
    if (it == by_step.end() || it->second->kind != CheckpointKind::kDelta ||
        it->second->base_step != base) {
      break;
    }
    out->push_back(u);
  }
}

}  // namespace

std::string RecoveryPoint::Describe() const {
  if (full_step < 0) return "none";
  if (delta_steps.empty()) return absl::StrCat("full ", full_step);
  return absl::StrCat("full ", full_step, " + ", delta_steps.size(),
                      delta_steps.size() == 1 ? " delta" : " deltas", " -> step ", step());
}

RecoveryPoint FindRecoveryPoint(const std::vector<CheckpointInfo>& list, int64_t max_full) {
  const auto by_step = Committed(list);
  RecoveryPoint rp;
  for (const auto& [step, info] : by_step) {
    if (info->kind == CheckpointKind::kFull && (max_full < 0 || step <= max_full)) {
      rp.full_step = step;
    }
  }
  if (rp.full_step >= 0) Chain(by_step, rp.full_step, -1, &rp.delta_steps);
  return rp;
}

absl::StatusOr<RecoveryPoint> PlanForStep(const std::vector<CheckpointInfo>& list, int64_t step) {
  const auto by_step = Committed(list);
  auto it = by_step.find(step);
  if (it == by_step.end()) {
    return absl::NotFoundError(absl::StrCat("no committed checkpoint at step ", step));
  }
  RecoveryPoint rp;
  if (it->second->kind == CheckpointKind::kFull) {
    rp.full_step = step;
    return rp;
  }
  const int64_t base = it->second->base_step;
  auto base_it = by_step.find(base);
  if (base < 0 || base_it == by_step.end() || base_it->second->kind != CheckpointKind::kFull) {
    return absl::NotFoundError(
        absl::StrCat("DELTA ", step, " needs FULL ", base, ", which is not committed"));
  }
  rp.full_step = base;
  Chain(by_step, base, step, &rp.delta_steps);
  if (rp.delta_steps.empty() || rp.delta_steps.back() != step) {
    const int64_t missing = rp.delta_steps.empty() ? base + 1 : rp.delta_steps.back() + 1;
    return absl::NotFoundError(absl::StrCat("DELTA ", step, " on FULL ", base,
                                            " cannot be replayed: DELTA ", missing,
                                            " of its chain is not committed"));
  }
  return rp;
}

}  // namespace recovery
}  // namespace gradsnap
