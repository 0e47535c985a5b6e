#include "common/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <system_error>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace gradsnap {
namespace {

// Whether the destination looks faulted in already (a reused buffer): kSamples pages spread
// over it are all resident. Then a helper would only walk page tables (and take a core).
bool Resident(uintptr_t begin, uintptr_t end, uintptr_t page) {
  constexpr int kSamples = 8;
  const uintptr_t pages = (end - begin) / page;
  for (int i = 0; i < kSamples; ++i) {
    const uintptr_t at = begin + pages * static_cast<uintptr_t>(i) / kSamples * page;
    unsigned char in = 0;
    if (::mincore(reinterpret_cast<void*>(at), page, &in) != 0) return true;  // not ours to try
    if ((in & 1) == 0) return false;
  }
  return true;
}

uintptr_t PageSize() { return static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE)); }

// The whole pages inside [p, p + n): {begin, end}, begin >= end when there are none.
std::pair<uintptr_t, uintptr_t> InnerPages(const void* p, size_t n, uintptr_t page) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  return {(at + page - 1) / page * page, (at + n) / page * page};
}

}  // namespace

PopulateAhead::PopulateAhead(void* dst, size_t n) : PopulateAhead({{dst, n}}) {}

PopulateAhead::PopulateAhead(const std::vector<std::pair<void*, size_t>>& ranges) {
  size_t total = 0;
  for (const auto& r : ranges) total += r.second;
  if (total < kMinBytes) return;
  const uintptr_t page = PageSize();
  std::vector<std::pair<uintptr_t, uintptr_t>> todo;  // whole pages, not resident yet
  for (const auto& r : ranges) {
    const auto [begin, end] = InnerPages(r.first, r.second, page);
    if (begin < end && !Resident(begin, end, page)) todo.emplace_back(begin, end);
  }
  if (todo.empty()) return;
  try {
    helper_ = std::thread([this, todo = std::move(todo)] {
      size_t done = 0;
      for (const auto& [begin, end] : todo) {
        for (uintptr_t at = begin; at < end && !stop_.load(std::memory_order_relaxed);) {
          const size_t len = std::min<uintptr_t>(kStep, end - at);
          if (::madvise(reinterpret_cast<void*>(at), len, MADV_POPULATE_WRITE) != 0) return;
          at += len;
          done += len;
          populated_.store(done, std::memory_order_relaxed);
        }
      }
    });
  } catch (const std::system_error&) {
    // Out of threads: the copy faults the pages in itself, as without a helper.
  }
}

PopulateAhead::~PopulateAhead() {
  stop_.store(true, std::memory_order_relaxed);
  if (helper_.joinable()) helper_.join();
}

void AdviseBasePages(void* p, size_t n) {
  if (n < (4u << 20)) return;
  const auto [begin, end] = InnerPages(p, n, PageSize());
  if (begin < end) {
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_NOHUGEPAGE);
  }
}

}  // namespace gradsnap
