// Small helpers of the tests and drills: whole-file reads, a flipped byte, file counts, free
// loopback ports.
// (Production code reads small files through common/small_file.h, which bounds their size.)
#ifndef GRADSNAP_TESTS_TESTING_UTIL_H_
#define GRADSNAP_TESTS_TESTING_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsnap {
namespace testing {

// The whole file, binary; NOT_FOUND / the errno's status when it cannot be opened.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// The whole file, or "" when it cannot be read (logs and outputs that may not exist yet).
std::string ReadFileOrEmpty(const std::string& path);

// XORs the byte at `offset` of the file `path` with `mask` (a simulated bad sector).
absl::Status FlipByte(const std::string& path, uint64_t offset, uint8_t mask);

// The segment files of (job, step) in the engine directory `data_dir` (docs/format.md), sorted;
// those of one rank when `rank` >= 0.
std::vector<std::string> SegmentFiles(const std::string& data_dir, const std::string& job,
                                      int64_t step, int rank = -1);
// Flips (XOR 0x10) the middle byte of each segment file of (job, step, rank) in `data_dir`.
// Returns how many files it changed.
int FlipSegmentBytes(const std::string& data_dir, const std::string& job, int64_t step, int rank);

// Every path below `dir` -> its bytes ("<dir>" for a directory): compared before and after, it
// shows that a command left a directory untouched.
std::map<std::string, std::string> DirContents(const std::string& dir);
// The number of regular files below `dir` (0 when it does not exist).
int CountFiles(const std::string& dir);

// Polls `cond` every 100 ms for up to `seconds` seconds: what a test waits for that a process
// does in its own time (a lease running out, a watch event), without asserting how long it
// takes. Returns cond()'s last answer.
bool WaitFor(const std::function<bool()>& cond, int seconds);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, then released).
absl::StatusOr<int> FreePort();

// The number of lines of `output` (each '\n'-terminated line, and an unterminated last one)
// that start with `prefix`.
int CountLines(const std::string& output, const std::string& prefix = "");

// A tmpfs of `size_mib` MiB mounted on `dir` (created first) while the object lives; mounted()
// is false where this process may not mount one (it needs CAP_SYS_ADMIN): the caller skips.
class Tmpfs {
 public:
  explicit Tmpfs(const std::string& dir, int size_mib = 64);
  ~Tmpfs();
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  bool mounted() const { return mounted_; }
  // Makes the mounted file system read-only.
  absl::Status RemountReadOnly();

 private:
  std::string dir_;
  std::string options_;  // the mount's "size=..."
  bool mounted_ = false;
};

// Makes `path` a file of zeros that fills the file system holding it.
void FillUp(const std::string& path);
// Makes `path` (a ballast file, truncated first) take space until the file system holding it
// has at most `leave_bytes` free (page-granular: tmpfs frees and takes whole pages): by
// fallocate where the file system has it (no data copied, little CPU), the rest by writes.
void FillUpLeaving(const std::string& path, uint64_t leave_bytes);

// Sleeps `ms` milliseconds (drills and tests that pace a fault).
void SleepMs(int64_t ms);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_UTIL_H_
