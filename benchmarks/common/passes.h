// --passes, shared by the benchmarks that measure several paths side by side (storage_bench,
// service_bench, client_bench): each runs every path this many times, interleaved with the
// others, because this VM's disk and CPU drift between passes. How a benchmark combines its
// passes (best or median) is in its own header and --help.
#ifndef GRADSNAP_BENCHMARKS_COMMON_PASSES_H_
#define GRADSNAP_BENCHMARKS_COMMON_PASSES_H_

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(int, passes);

namespace gradsnap {
namespace bench {

constexpr int kMaxPasses = 20;

// The --passes value; out of 1..kMaxPasses, prints one line naming `program` and exits 2.
int Passes(const char* program);

}  // namespace bench
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_COMMON_PASSES_H_
