#include "common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace gradsnap {
namespace {

// An open regular file; closed on destruction.
class InputFile {
 public:
  InputFile() = default;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Opens `path` without blocking (a FIFO with no writer would wait forever) and checks that it
  // is a regular file.
  absl::Status Open(const std::string& path, const char* what) {
    path_ = path;
    what_ = what;
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0 && errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(what, " ", path, " does not exist"));
    }
    if (fd_ < 0) {
      return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path, ": ",
                                              std::strerror(errno)));
    }
    struct stat st = {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", path, S_ISDIR(st.st_mode) ? " is a directory" : " is not a regular file"));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    return absl::OkStatus();
  }

  // Reads up to n bytes into buf; 0 at the end of the file.
  absl::StatusOr<size_t> Read(void* buf, size_t n) {
    for (;;) {
      const ssize_t got = ::read(fd_, buf, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) return PosixError(absl::StrCat("read ", what_, " ", path_), errno);
    }
  }

  // The size when opened.
  uint64_t size() const { return size_; }

  absl::Status TooLarge(size_t limit) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, " ", path_, " is larger than ", limit, " bytes"));
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
  const char* what_ = "";
};

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what,
                                          size_t max_bytes) {
  InputFile in;
  RETURN_IF_ERROR(in.Open(path, what));
  // Read to the end rather than trusting the size: files under /proc report 0.
  std::string out;
  char buf[16384];
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, in.Read(buf, sizeof(buf)));
    if (n == 0) return out;
    out.append(buf, n);
    if (out.size() > max_bytes) return in.TooLarge(max_bytes);
  }
}

absl::Status AppendFile(const std::string& path, const char* what, uint64_t max_total,
                        std::vector<uint8_t>* out) {
  InputFile in;
  RETURN_IF_ERROR(in.Open(path, what));
  const size_t start = out->size();
  if (start > max_total || in.size() > max_total - start) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " has ", in.size(),
                                                   " bytes; the limit is ", max_total,
                                                   " bytes in all (", start, " already read)"));
  }
  out->resize(start + in.size());
  size_t done = 0;
  while (done < in.size()) {
    absl::StatusOr<size_t> n = in.Read(out->data() + start + done, in.size() - done);
    if (!n.ok() || *n == 0) {
      out->resize(start + done);  // a file that shrank meanwhile
      return n.status();
    }
    done += *n;
  }
  return absl::OkStatus();
}

}  // namespace gradsnap
