// The POSIX FileSystem.
#include "storage/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"

namespace gradsnap {
namespace storage {
namespace {

class PosixFile : public File {
 public:
  PosixFile(std::string path, int fd, bool direct)
      : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixFile() override { ::close(fd_); }
  int fd() const override { return fd_; }
  bool direct() const override { return direct_; }

  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    for (int spins = 0; n > 0;) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return PosixError(absl::StrCat("pwrite ", path_), errno);
      }
      if (w == 0 && ++spins > 100) return PosixError(absl::StrCat("pwrite ", path_), EIO);
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(uint64_t offset, void* out, size_t n) override {
    char* p = static_cast<char*>(out);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return PosixError(absl::StrCat("pread ", path_), errno);
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  }

  absl::Status Sync() override {
    if (::fdatasync(fd_) != 0) return PosixError(absl::StrCat("fdatasync ", path_), errno);
    return absl::OkStatus();
  }

  absl::Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return PosixError(absl::StrCat("ftruncate ", path_), errno);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return PosixError(absl::StrCat("fstat ", path_), errno);
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  const std::string path_;
  const int fd_;
  const bool direct_;
};

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& o) override {
    int flags = O_CLOEXEC | (o.write ? O_RDWR : O_RDONLY) | (o.create ? O_CREAT : 0) |
                (o.truncate ? O_TRUNC : 0) | (o.create && o.exclusive ? O_EXCL : 0);
    int fd = -1;
    bool direct = false;
    if (o.direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      direct = fd >= 0;
      if (fd < 0 && errno != EINVAL) return PosixError(absl::StrCat("open ", path), errno);
      // A file system that refuses O_DIRECT may have created the file before refusing it: the
      // exclusive open already made the name this call's, so the buffered retry opens it.
      if (fd < 0) flags &= ~O_EXCL;
    }
    if (fd < 0) fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return PosixError(absl::StrCat("open ", path), errno);
    return std::unique_ptr<File>(new PosixFile(path, fd, direct));
  }

  absl::Status CreateDirs(const std::string& path) override {
    std::filesystem::path p(path);
    std::vector<std::filesystem::path> created;
    for (auto cur = p; !cur.empty() && cur != cur.root_path(); cur = cur.parent_path()) {
      std::error_code ec;
      if (std::filesystem::exists(cur, ec)) break;
      created.push_back(cur);
    }
    for (auto it = created.rbegin(); it != created.rend(); ++it) {
      if (::mkdir(it->c_str(), 0755) != 0 && errno != EEXIST) {
        return PosixError(absl::StrCat("mkdir ", it->string()), errno);
      }
      RETURN_IF_ERROR(SyncDir(it->parent_path().empty() ? "." : it->parent_path().string()));
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError(absl::StrCat("open dir ", path), errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return PosixError(absl::StrCat("fsync dir ", path), err);
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return PosixError(absl::StrCat("unlink ", path), errno);
    }
    return absl::OkStatus();
  }

  absl::Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return PosixError(absl::StrCat("remove ", path), ec.value());
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError(absl::StrCat("rename ", from, " to ", to), errno);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return PosixError(absl::StrCat("opendir ", path), errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(std::move(n));
    }
    ::closedir(d);
    return names;
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static FileSystem* fs = new PosixFileSystem();
  return fs;
}

namespace {

// The directories of this process's temporaries, and the lock that RemoveOwnTempFiles takes
// exclusively (and keeps) while renames of finished temporaries share it.
struct TempRegistry {
  absl::Mutex mu;
  std::set<std::string> dirs ABSL_GUARDED_BY(mu);
  absl::Mutex rename_mu;
};

TempRegistry& Temps() {
  static TempRegistry* r = new TempRegistry();
  return *r;
}

}  // namespace

std::string UniqueTempPath(const std::string& path) {
  static std::atomic<uint64_t> next{0};
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  {
    TempRegistry& r = Temps();
    absl::MutexLock lock(&r.mu);
    r.dirs.insert(std::move(dir));
  }
  return absl::StrCat(path, ".tmp-", ::getpid(), "-", next.fetch_add(1));
}

// The lock outlives these scopes by design (a section's, and the remover's until exit).
TempRenameSection::TempRenameSection() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Temps().rename_mu.ReaderLock();
}
TempRenameSection::~TempRenameSection() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Temps().rename_mu.ReaderUnlock();
}

int RemoveOwnTempFiles() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  TempRegistry& r = Temps();
  r.rename_mu.Lock();  // never released: the caller exits
  std::set<std::string> dirs;
  {
    absl::MutexLock lock(&r.mu);
    dirs = r.dirs;
  }
  const std::string own = absl::StrCat(".tmp-", ::getpid(), "-");
  int removed = 0;
  for (const std::string& dir : dirs) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) continue;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      const size_t at = name.rfind(own);
      if (at == std::string::npos || !IsUniqueTempPath(name) ||
          name.find('-', at + own.size()) != std::string::npos) {
        continue;
      }
      if (::unlinkat(::dirfd(d), name.c_str(), 0) == 0) ++removed;
    }
    ::closedir(d);
  }
  return removed;
}

bool IsUniqueTempPath(const std::string& name) {
  const size_t tmp = name.rfind(".tmp-");
  if (tmp == std::string::npos) return false;
  const std::string rest = name.substr(tmp + 5);  // PID-N
  const size_t dash = rest.find('-');
  auto digits = [](absl::string_view s) {
    return !s.empty() && s.find_first_not_of("0123456789") == absl::string_view::npos;
  };
  return dash != std::string::npos && digits(absl::string_view(rest).substr(0, dash)) &&
         digits(absl::string_view(rest).substr(dash + 1));
}

}  // namespace storage
}  // namespace gradsnap
