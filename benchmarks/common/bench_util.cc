#include "benchmarks/common/bench_util.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <system_error>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsnap {
namespace bench {

void InitBenchmark(int argc, char** argv, const char* usage) {
  absl::SetProgramUsageMessage(usage);
  // --help lists the benchmark's own flags (its NAME.cc or NAME_main.cc) and the shared --passes.
  absl::FlagsUsageConfig config;
  const std::string program = std::filesystem::path(argv[0]).filename().string();
  config.contains_help_flags = [own = absl::StrCat("/", program, ".")](absl::string_view file) {
    return absl::EndsWith(file, "benchmarks/common/passes.cc") || absl::StrContains(file, own) ||
           absl::StrContains(file, absl::StrCat(own.substr(0, own.size() - 1), "_main."));
  };
  absl::SetFlagsUsageConfig(config);
  absl::ParseCommandLine(argc, argv);
  if (std::getenv("GRADSNAP_LOG_LEVEL") == nullptr) SetLogLevel(LogLevel::kWarning);
}

namespace {
std::string& ProgramName() {
  static std::string* name = new std::string;
  return *name;
}
}  // namespace

void InitBenchmark(int argc, char** argv, const char* program, const char* flags) {
  ProgramName() = program;
  InitBenchmark(argc, argv, absl::StrCat(program, " ", flags).c_str());
}

void BadFlag(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", ProgramName().c_str(), message.c_str());
  std::exit(2);
}

double CpuSeconds() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double UserCpuSeconds() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
}

double CpuSecondsOf(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) in parentheses: state is field 3,
  // utime 14 and stime 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string skip;
  for (int field = 3; field < 14; ++field) fields >> skip;
  unsigned long long utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) return -1;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

void DropPageCache(const std::string& dir) {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    bool ok = ::write(fd, "3", 1) == 1;
    ::close(fd);
    if (ok) return;
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    int f = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (f < 0) continue;
    ::fdatasync(f);
    ::posix_fadvise(f, 0, 0, POSIX_FADV_DONTNEED);
    ::close(f);
  }
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t ParseBytes(const std::string& s) {
  if (s.empty()) return 0;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    return 0;
  }
  const std::string suffix = s.substr(used);
  double mult = 1;
  if (suffix == "K" || suffix == "KiB") {
    mult = 1ull << 10;
  } else if (suffix == "M" || suffix == "MiB") {
    mult = 1ull << 20;
  } else if (suffix == "G" || suffix == "GiB") {
    mult = 1ull << 30;
  } else if (suffix == "T" || suffix == "TiB") {
    mult = 1ull << 40;
  } else if (!suffix.empty()) {
    return 0;
  }
  return v > 0 ? static_cast<uint64_t>(v * mult) : 0;
}

bool RawDirectIo(const std::string& path, const std::vector<IoPiece>& pieces, bool write,
                 int queue_depth) {
  const int flags = O_DIRECT | O_CLOEXEC | (write ? O_RDWR | O_CREAT | O_TRUNC : O_RDONLY);
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return false;
  io_uring ring;
  if (io_uring_queue_init(static_cast<unsigned>(queue_depth), &ring, 0) < 0) {
    ::close(fd);
    return false;
  }
  size_t next = 0, inflight = 0;
  bool ok = true;
  while (ok && (next < pieces.size() || inflight > 0)) {
    while (inflight < static_cast<size_t>(queue_depth) && next < pieces.size()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      const IoPiece& pc = pieces[next++];
      if (write) {
        io_uring_prep_write(sqe, fd, pc.p, static_cast<unsigned>(pc.n), pc.offset);
      } else {
        io_uring_prep_read(sqe, fd, pc.p, static_cast<unsigned>(pc.n), pc.offset);
      }
      ++inflight;
    }
    io_uring_submit(&ring);
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) {
      ok = false;
      break;
    }
    do {
      if (cqe->res < 0) ok = false;
      io_uring_cqe_seen(&ring, cqe);
      --inflight;
    } while (io_uring_peek_cqe(&ring, &cqe) == 0);
  }
  if (write && ::fdatasync(fd) != 0) ok = false;
  io_uring_queue_exit(&ring);
  ::close(fd);
  return ok;
}

}  // namespace bench
}  // namespace gradsnap
