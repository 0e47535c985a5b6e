#include "common/huge_map.h"

#include <sys/mman.h>

#include <cstdint>

namespace gradsnap {
namespace {

constexpr size_t kPage = 4096;

size_t RoundPages(size_t bytes) { return (bytes == 0 ? 1 : bytes + kPage - 1) / kPage * kPage; }

}  // namespace

void* MapHuge(size_t bytes, bool populate) {
  const size_t len = RoundPages(bytes);
  const size_t span = len + kHugePageSize;  // room to align the start
  void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (base + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  if (start > base) ::munmap(m, start - base);
  const uintptr_t end = start + len;
  if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
  auto* p = reinterpret_cast<char*>(start);
  // Only a hint: the trailing partial 2 MiB page stays on 4 KiB pages (no memory is added).
  const size_t whole = len / kHugePageSize * kHugePageSize;
  if (whole > 0) (void)::madvise(p, whole, MADV_HUGEPAGE);
  if (populate) FaultIn(p, len);
  return p;
}

void FaultIn(void* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  volatile char* v = static_cast<char*>(p);  // the stores must happen; their values are unused
  for (size_t i = 0; i < bytes; i += kPage) v[i] = 0;
}

void UnmapHuge(void* p, size_t bytes) {
  if (p != nullptr) ::munmap(p, RoundPages(bytes));
}

}  // namespace gradsnap
