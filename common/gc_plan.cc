// FullsOutsidePolicy: common/gc_plan.h.
#include "common/gc_plan.h"

#include <algorithm>
#include <climits>

#include "common/logging.h"

namespace gradsnap {
namespace storage {

absl::StatusOr<std::vector<int64_t>> FullsOutsidePolicy(
    const std::string& job, const std::vector<CheckpointInfo>& committed, const GcPolicy& policy,
    const VerifyFullFn& verify) {
  if (policy.keep_last < 0 || policy.keep_every < 0) {
    return absl::InvalidArgumentError("keep_last and keep_every must be >= 0");
  }
  std::vector<int64_t> fulls;  // committed, ascending
  for (const CheckpointInfo& c : committed) {
    if (c.kind == CheckpointKind::kFull && c.state == CheckpointState::kCommitted) {
      fulls.push_back(c.step);
    }
  }
  std::sort(fulls.begin(), fulls.end());
  // keep_last: from the newest down until keep_last of them verify.
  int64_t keep_from = INT64_MIN;  // FULLs below this step may go
  if (policy.keep_last > 0) {
    int verified = 0;
    for (auto it = fulls.rbegin(); it != fulls.rend() && verified < policy.keep_last; ++it) {
      keep_from = *it;
      absl::Status v = verify(*it);
      if (v.ok()) {
        ++verified;
      } else if (absl::IsDataLoss(v)) {
        GS_LOG(WARNING) << "gc: job " << job << " FULL " << *it
                        << " does not verify; kept, not counted toward keep_last: " << v.message();
      } else {
        return v;  // cannot tell: delete nothing
      }
    }
    if (verified < policy.keep_last) keep_from = INT64_MIN;  // too few good FULLs: keep all
  }
  std::vector<int64_t> doomed;
  for (size_t i = 0; i < fulls.size() && fulls[i] < keep_from; ++i) {
    const int64_t step = fulls[i];
    // keep_every K keeps, for every multiple of K, the newest FULL at or before it (the FULL
    // a restore of that step starts from): FULLs on multiples of K where they are there, and
    // one FULL per K steps where they are not (gockpt's FULLs end their window after it).
    if (policy.keep_every > 0 && i + 1 < fulls.size()) {
      const int64_t k = policy.keep_every;
      const int64_t to_multiple = (k - step % k) % k;
      if (to_multiple < fulls[i + 1] - step) continue;  // a multiple in [step, next FULL)
    }
    doomed.push_back(step);
  }
  return doomed;
}

}  // namespace storage
}  // namespace gradsnap
