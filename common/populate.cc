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

}  // namespace

PopulateAhead::PopulateAhead(void* dst, size_t n) {
  if (n < kMinBytes) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(dst) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(dst) + n) / page * page;
  if (end <= begin || Resident(begin, end, page)) return;
  try {
    helper_ = std::thread([this, begin, end] {
      for (uintptr_t at = begin; at < end && !stop_.load(std::memory_order_relaxed);) {
        const size_t len = std::min<uintptr_t>(kStep, end - at);
        if (::madvise(reinterpret_cast<void*>(at), len, MADV_POPULATE_WRITE) != 0) return;
        at += len;
        populated_.store(at - begin, std::memory_order_relaxed);
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

}  // namespace gradsnap
