// Faulting in a fresh destination ahead of the copy that fills it.
//
// OVERVIEW
//   A restore into memory the process just allocated (a trainer restarted after a failure
//   restores into the model it has just built; torch.load-style callers allocate fresh
//   tensors) pays a page fault per 4 KiB page inside its copy: on the project's VM that copy
//   ran at 2.1 GB/s into fresh pages against 3.3 GB/s into touched ones. PopulateAhead has a
//   helper thread fault the destination in, 2 MiB at a time (madvise MADV_POPULATE_WRITE: one
//   system call instead of 512 faults), from its start onwards, while the caller copies: the
//   copy mostly finds its pages present, and where it catches up it faults them itself, as
//   before. A destination that looks faulted in already (8 pages spread over it resident,
//   mincore) gets no helper: a reused buffer costs nothing. A destination of several ranges
//   (a restore's tensors, in the order the copy fills them) is walked range by range by one
//   helper; ranges that look faulted in are skipped.
//
//   Only whole pages inside the destination are populated (never a byte outside it), and the
//   contents never change: MADV_POPULATE_WRITE faults pages in as a write would, without
//   writing. Where the kernel refuses it (before Linux 5.14, or memory it cannot populate)
//   the helper stops at once and the copy faults its pages as it always did.
//
// THREAD SAFETY
//   One object per copy; the destructor stops the helper and waits for it.
#ifndef GRADSNAP_COMMON_POPULATE_H_
#define GRADSNAP_COMMON_POPULATE_H_

#include <atomic>
#include <cstddef>
#include <thread>
#include <utility>
#include <vector>

namespace gradsnap {

class PopulateAhead {
 public:
  // Destinations smaller than this (all ranges together) are copied without a helper (a
  // thread costs more).
  static constexpr size_t kMinBytes = 16u << 20;
  static constexpr size_t kStep = 2u << 20;

  PopulateAhead(void* dst, size_t n);
  // Ranges {start, bytes}, populated in the order given.
  explicit PopulateAhead(const std::vector<std::pair<void*, size_t>>& ranges);
  ~PopulateAhead();
  PopulateAhead(const PopulateAhead&) = delete;
  PopulateAhead& operator=(const PopulateAhead&) = delete;

  // Bytes populated so far (for tests); stops growing at the end, on stop or on refusal.
  size_t populated() const { return populated_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<size_t> populated_{0};
  std::thread helper_;
};

// Advises the kernel to back the whole pages inside [p, p + n) with base pages, not
// transparent huge pages (madvise MADV_NOHUGEPAGE), for a fresh destination about to be filled
// by a restore; a no-op below 4 MiB (where NumPy advises none either) and where the kernel
// refuses. Why: docs/performance.md, "Restore into fresh memory".
void AdviseBasePages(void* p, size_t n);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_POPULATE_H_
