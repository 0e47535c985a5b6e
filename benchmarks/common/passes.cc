#include "benchmarks/common/passes.h"

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"

ABSL_FLAG(int, passes, 3,
          "Times each measured path runs (1..20), interleaved with the other paths. "
          "Default: 3");

namespace gradsnap {
namespace bench {

int Passes(const char* program) {
  const int passes = absl::GetFlag(FLAGS_passes);
  if (passes < 1 || passes > kMaxPasses) {
    std::fprintf(stderr, "%s: --passes must be 1..%d, not %d\n", program, kMaxPasses, passes);
    std::exit(2);
  }
  return passes;
}

}  // namespace bench
}  // namespace gradsnap
