// Helpers shared by the benchmarks (storage_bench, restore_bench, service_bench, client_bench,
// fault_drill, trainer_throughput): the start of main(), CPU accounting, dropping the page cache
// before a cold read, and byte-size flags.
//
// THREAD SAFETY: stateless functions, but for the program name InitBenchmark keeps for
// BadFlag (set once, at the start of main(), before any thread).
#ifndef GRADSNAP_BENCHMARKS_COMMON_BENCH_UTIL_H_
#define GRADSNAP_BENCHMARKS_COMMON_BENCH_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradsnap {
namespace bench {

// The start of every benchmark's main(): sets `usage` as the first line of --help, parses the
// Abseil flags (exits on a bad flag or --help) and, unless GRADSNAP_LOG_LEVEL is set, logs
// warnings and errors only, so that info lines do not interleave with the figures.
void InitBenchmark(int argc, char** argv, const char* usage);
// The same with the first line of --help "`program` `flags`"; keeps `program` for BadFlag.
void InitBenchmark(int argc, char** argv, const char* program, const char* flags);
// For a bad flag value: prints "PROGRAM: `message`" (the program named to InitBenchmark) on
// stderr and exits 2.
[[noreturn]] void BadFlag(const std::string& message);

// User + system CPU seconds of this process so far (all threads).
double CpuSeconds();
// User CPU seconds only: the process's own code, without the kernel's work for its syscalls.
double UserCpuSeconds();
// User + system CPU seconds of process `pid` so far (from /proc/PID/stat, in clock ticks of
// 10 ms); -1 when it cannot be read.
double CpuSecondsOf(int pid);

// Drops the page cache before a cold read: the whole cache when this process may write
// /proc/sys/vm/drop_caches (root; what a cold torch.load sees), else every file under `dir`
// (fdatasync + POSIX_FADV_DONTNEED).
void DropPageCache(const std::string& dir);

// The median of `v` (the mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> v);

// The median over `passes` of f(pass): a figure of a benchmark that runs its passes
// interleaved.
template <typename Pass, typename F>
double MedianOver(const std::vector<Pass>& passes, F f) {
  std::vector<double> v;
  for (const Pass& p : passes) v.push_back(f(p));
  return Median(std::move(v));
}

// "256M", "8G", "1073741824" -> bytes (binary K/M/G/T suffixes, also KiB/MiB/GiB/TiB); 0 when
// malformed or not positive.
uint64_t ParseBytes(const std::string& s);

// One request of RawDirectIo: n bytes at file offset `offset` from/into p (all 4 KiB aligned).
struct IoPiece {
  uint8_t* p;
  size_t n;
  uint64_t offset;
};

// The disk's speed without the engine: writes (creating or truncating `path`, then fdatasync)
// or reads every piece with io_uring and O_DIRECT, `queue_depth` requests in flight. False on
// any error.
bool RawDirectIo(const std::string& path, const std::vector<IoPiece>& pieces, bool write,
                 int queue_depth);

}  // namespace bench
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_COMMON_BENCH_UTIL_H_
