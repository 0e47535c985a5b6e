#include "benchmarks/common/bench_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/logging.h"

namespace gradsnap {
namespace bench {

void InitBenchmark(int argc, char** argv, const char* usage) {
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  SetLogLevel(LogLevel::kWarning);
}

void DropPageCache(const std::string& dir) {
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

uint64_t DiskReadBytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (f >> key >> v) {
    if (key == "read_bytes:") return v;
  }
  return 0;
}

}  // namespace bench
}  // namespace gradsnap
