#include "tests/testing/util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "common/status.h"

namespace gradsnap {
namespace testing {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return PosixError("open " + path, errno);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InternalError("read " + path + " failed");
  return data;
}

std::string ReadFileOrEmpty(const std::string& path) {
  absl::StatusOr<std::string> data = ReadFile(path);
  return data.ok() ? *std::move(data) : "";
}

absl::Status FlipByte(const std::string& path, uint64_t offset, uint8_t mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char b = 0;
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(&b, 1);
  b = static_cast<char>(b ^ static_cast<char>(mask));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&b, 1);
  f.flush();
  if (!f) return absl::InternalError("cannot flip byte " + std::to_string(offset) + " of " + path);
  return absl::OkStatus();
}

std::vector<std::string> SegmentFiles(const std::string& data_dir, const std::string& job,
                                      int64_t step, int rank) {
  char step_dir[32], prefix[32];
  std::snprintf(step_dir, sizeof(step_dir), "%020lld", static_cast<long long>(step));
  std::snprintf(prefix, sizeof(prefix), "r%010d-", rank);
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(data_dir + "/segments/" + job + "/" + step_dir, ec),
       end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (rank < 0 || name.rfind(prefix, 0) == 0) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int FlipSegmentBytes(const std::string& data_dir, const std::string& job, int64_t step, int rank) {
  int flipped = 0;
  for (const std::string& file : SegmentFiles(data_dir, job, step, rank)) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(file, ec);
    if (!ec && FlipByte(file, size / 2, 0x10).ok()) ++flipped;
  }
  return flipped;
}

std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string path = it->path().string();
    out[path] = it->is_regular_file(ec) ? ReadFileOrEmpty(path) : "<dir>";
  }
  return out;
}

int CountFiles(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file(ec)) ++n;
  }
  return n;
}

absl::StatusOr<int> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("socket", errno);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    ::close(fd);
    return PosixError("bind 127.0.0.1:0", e);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

int CountLines(const std::string& output, const std::string& prefix) {
  std::istringstream in(output);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

Tmpfs::Tmpfs(const std::string& dir, int size_mib)
    : dir_(dir), options_("size=" + std::to_string(size_mib) + "m") {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  mounted_ = !ec && ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options_.c_str()) == 0;
}

Tmpfs::~Tmpfs() {
  if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
}

absl::Status Tmpfs::RemountReadOnly() {
  if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, options_.c_str()) != 0) {
    return PosixError("remount " + dir_ + " read-only", errno);
  }
  return absl::OkStatus();
}

void FillUp(const std::string& path) { FillUpLeaving(path, 0); }

void FillUpLeaving(const std::string& path, uint64_t leave_bytes) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  auto free_bytes = [&]() -> uint64_t {
    struct statvfs st;
    if (::statvfs(parent.c_str(), &st) != 0) return 0;
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  };
  // fallocate where the file system has it (tmpfs, ext4): the space is taken without copying
  // a byte through the page cache, so a large fill costs the machine little CPU.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  off_t end = 0;
  for (uint64_t free = free_bytes(); free > leave_bytes; free = free_bytes()) {
    const off_t n = static_cast<off_t>(std::min<uint64_t>(free - leave_bytes, 64ull << 20));
    if (::posix_fallocate(fd, end, n) != 0) break;
    end += n;
  }
  // The rest (a file system without fallocate, or a last block it rounded) by writes.
  const std::string block(1 << 16, '\0');
  ::lseek(fd, end, SEEK_SET);
  for (uint64_t free = free_bytes(); free > leave_bytes; free = free_bytes()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), free - leave_bytes));
    if (::write(fd, block.data(), n) <= 0) break;
  }
  ::close(fd);
}

void SleepMs(int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

bool WaitFor(const std::function<bool()>& cond, int seconds) {
  for (int i = 0; i < seconds * 10; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return cond();
}

}  // namespace testing
}  // namespace gradsnap
