#include "common/rank_slice.h"

#include <algorithm>

namespace gradsnap {

RankSlice SliceOfRank(size_t total, int rank, int world_size) {
  const size_t p = static_cast<size_t>(world_size), r = static_cast<size_t>(rank);
  const size_t base = total / p, extra = total % p;
  RankSlice s;
  s.lo = r * base + std::min(r, extra);
  s.hi = s.lo + base + (r < extra ? 1 : 0);
  return s;
}

}  // namespace gradsnap
