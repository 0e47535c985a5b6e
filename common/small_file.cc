#include "common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace gradsnap {
namespace {

// An input file opened for reading; the caller closes fd.
struct InputFile {
  int fd = -1;
  uint64_t size = 0;  // when opened
};

// Opens `path` without blocking (a FIFO with no writer would wait forever) and checks that it is
// a regular file.
absl::StatusOr<InputFile> OpenRegular(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, " does not exist"));
  }
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path, ": ",
                                            std::strerror(errno)));
  }
  struct stat st = {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode) ? " (it is a directory)" : "";
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " is not a regular file", kind));
  }
  return InputFile{fd, static_cast<uint64_t>(st.st_size)};
}

// Reads up to n bytes into buf; 0 at the end of the file.
absl::StatusOr<size_t> ReadSome(int fd, void* buf, size_t n, const std::string& path,
                                const char* what) {
  for (;;) {
    const ssize_t got = ::read(fd, buf, n);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) return PosixError(absl::StrCat("read ", what, " ", path), errno);
  }
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what,
                                          size_t max_bytes) {
  ASSIGN_OR_RETURN(const InputFile in, OpenRegular(path, what));
  absl::Cleanup close_fd = [&in] { ::close(in.fd); };
  // Read to the end rather than trusting the size: files under /proc report 0.
  std::string out;
  char buf[16384];
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, ReadSome(in.fd, buf, sizeof(buf), path, what));
    if (n == 0) return out;
    out.append(buf, n);
    if (out.size() > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", path, " is larger than ", max_bytes, " bytes"));
    }
  }
}

absl::Status AppendFile(const std::string& path, const char* what, uint64_t max_total,
                        std::vector<uint8_t>* out) {
  ASSIGN_OR_RETURN(const InputFile in, OpenRegular(path, what));
  absl::Cleanup close_fd = [&in] { ::close(in.fd); };
  const size_t start = out->size();
  if (start > max_total || in.size > max_total - start) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " has ", in.size,
                                                   " bytes; the limit is ", max_total,
                                                   " bytes in all (", start, " already read)"));
  }
  out->resize(start + in.size);
  size_t done = 0;
  while (done < in.size) {
    absl::StatusOr<size_t> n = ReadSome(in.fd, out->data() + start + done, in.size - done, path,
                                        what);
    if (!n.ok() || *n == 0) {
      out->resize(start + done);  // a file that shrank meanwhile
      return n.status();
    }
    done += *n;
  }
  return absl::OkStatus();
}

}  // namespace gradsnap
