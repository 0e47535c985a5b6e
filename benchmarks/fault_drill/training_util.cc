#include "benchmarks/fault_drill/training_util.h"

#include <map>
#include <vector>

namespace gradsnap {
namespace drill {
absl::StatusOr<StoreReport> CheckStore(client::Client& c, const std::string& job,
                                       const std::set<int64_t>& recovery_points) {
  absl::StatusOr<std::vector<client::CheckpointInfo>> list = c.List(job, /*include_pending=*/true);
  if (!list.ok()) return list.status();
  StoreReport r;
  std::map<int64_t, client::CheckpointInfo> by_step;
  for (const client::CheckpointInfo& i : *list) {
    if (i.state == client::CheckpointState::kCommitted) {
      by_step[i.step] = i;
    } else {
      ++r.pending_left;
    }
  }
  for (int64_t rp : recovery_points) {
    r.recovery_points_lost += by_step.count(rp) == 0 || !c.Verify(job, rp).ok();
  }
  for (const auto& [step, info] : by_step) {
    ++r.listed;
    const bool full = info.kind == client::CheckpointKind::kFull;
    (full ? r.fulls : r.deltas) += 1;
    absl::StatusOr<client::Manifest> m = c.Show(job, step);
    int committed_shards = 0;
    if (m.ok()) {
      for (const client::ShardInfo& s : m->shards) committed_shards += s.committed ? 1 : 0;
    }
    if (committed_shards < info.world_size) ++r.partial_listed;
    absl::Status v = c.Verify(job, step);
    if (absl::IsDataLoss(v)) {
      ++r.lost_data;
    } else if (!v.ok()) {
      ++r.verify_errors;
    }
    if (full) continue;
    auto base = by_step.find(info.base_step);
    if (base == by_step.end() || base->second.kind != client::CheckpointKind::kFull) {
      ++r.orphan_deltas_listed;
      continue;
    }
    if (step - 1 != info.base_step) {
      auto prev = by_step.find(step - 1);
      if (prev == by_step.end() || prev->second.kind != client::CheckpointKind::kDelta ||
          prev->second.base_step != info.base_step) {
        ++r.chain_holes_listed;
      }
    }
  }
  return r;
}

}  // namespace drill
}  // namespace gradsnap
