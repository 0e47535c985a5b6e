// The ZeRO-1 partition of a flat buffer over ranks, shared by the trainer (which owns and
// all-gathers the slices) and recovery (which re-cuts a restored state for another world size).
//
// THREAD SAFETY: a value type and a pure function.
#ifndef GRADSNAP_COMMON_RANK_SLICE_H_
#define GRADSNAP_COMMON_RANK_SLICE_H_

#include <cstddef>

namespace gradsnap {

// Rank r of P owns [lo, hi) of the flat buffer; slices are contiguous, cover the buffer in rank
// order, and differ in length by at most one element (the first total % P are one longer).
struct RankSlice {
  size_t lo = 0;
  size_t hi = 0;
  size_t size() const { return hi - lo; }
};

// The slice of rank `rank` of `world_size` over `total` elements.
RankSlice SliceOfRank(size_t total, int rank, int world_size);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_RANK_SLICE_H_
