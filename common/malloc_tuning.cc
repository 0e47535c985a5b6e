#include "common/malloc_tuning.h"

#include <malloc.h>

namespace gradsnap {

void TuneMallocForStreaming(bool few_arenas) {
  mallopt(M_MMAP_THRESHOLD, 2 << 20);
  mallopt(M_TRIM_THRESHOLD, 32 << 20);
  mallopt(M_TOP_PAD, 8 << 20);
  if (few_arenas) mallopt(M_ARENA_MAX, 4);
}

}  // namespace gradsnap
