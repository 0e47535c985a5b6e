// storage_crash_child: a test helper for crash_test.cc. Writes checkpoints of job "crash" in
// an endless loop (two ranks written concurrently, a Flush mid-shard, DELTAs, GC), first
// finishing any checkpoint a previous, killed child left PENDING. The parent SIGKILLs it at
// random moments and checks what survived. Contents are a pure function of (step, rank), so
// the parent can regenerate them.
//
// Usage: storage_crash_child DIR FIRST_STEP USE_IO_URING(0|1)
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "storage/crash_workload.h"

int main(int argc, char** argv) {
  int64_t first = 0;
  int uring = 1;
  if (argc != 4 || !absl::SimpleAtoi(argv[2], &first) || !absl::SimpleAtoi(argv[3], &uring)) {
    std::fprintf(stderr, "usage: storage_crash_child DIR FIRST_STEP USE_IO_URING\n");
    return 2;
  }
  absl::Status s = gradsnap::storage::RunCrashWorkload(argv[1], first, uring != 0);
  std::fprintf(stderr, "storage_crash_child: %s\n", s.ToString().c_str());
  return 1;
}
