// Large buffers on transparent huge pages.
//
// OVERVIEW
//   MapHuge(bytes) maps `bytes` (rounded up to 4 KiB) of anonymous memory starting on a 2 MiB
//   boundary, and advises its whole 2 MiB pages MADV_HUGEPAGE. Faulting a 2 MiB page in is one
//   fault instead of 512 (each with its own kernel entry and accounting), and a copy through
//   it misses the TLB 512 times less often. Where the kernel has no huge pages to give (THP
//   off, or none free) the mapping works the same on 4 KiB pages. Used by the storage engine's
//   record buffers (storage/aligned_buffer.h), the host device's staging buffers and the
//   trainer's checkpoint backlog: buffers of many MiB that live for the whole job.
//
//   MapHuge(bytes, /*populate=*/true) also faults every page in now (FaultIn), so the first
//   copy into the buffer runs at memcpy speed instead of paying its faults.
//
// THREAD SAFETY
//   Plain functions.
#ifndef GRADSNAP_COMMON_HUGE_MAP_H_
#define GRADSNAP_COMMON_HUGE_MAP_H_

#include <cstddef>

namespace gradsnap {

constexpr size_t kHugePageSize = 2u << 20;

// Null when the kernel refuses the mapping (out of memory). The size to pass to UnmapHuge is
// the one given here.
void* MapHuge(size_t bytes, bool populate = false);
void UnmapHuge(void* p, size_t bytes);

// Faults in every page of [p, p + bytes) (p page-aligned) now: MADV_POPULATE_WRITE, or where
// the kernel lacks it a write per page (of 0, at the page's first byte).
void FaultIn(void* p, size_t bytes);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_HUGE_MAP_H_
