// Helpers shared by the benchmarks: one start-up, and cold-read figures measured one way
// (evicting a directory's files from the page cache, the bytes this process read from disk).
#ifndef GRADSNAP_BENCHMARKS_COMMON_BENCH_UTIL_H_
#define GRADSNAP_BENCHMARKS_COMMON_BENCH_UTIL_H_

#include <cstdint>
#include <string>

namespace gradsnap {
namespace bench {

// A benchmark's start: the --help text `usage`, its flags parsed, and the log quiet
// (warnings and errors only) so that it does not mix with the figures.
void InitBenchmark(int argc, char** argv, const char* usage);

// Evicts every regular file below `dir` from the page cache (fdatasync, then
// POSIX_FADV_DONTNEED), so the next read comes from the disk. Best effort: files that cannot be
// opened are skipped.
void DropPageCache(const std::string& dir);

// read_bytes of /proc/self/io: bytes this process caused to be read from storage (0 if unknown).
uint64_t DiskReadBytes();

}  // namespace bench
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_COMMON_BENCH_UTIL_H_
