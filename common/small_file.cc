#include "common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsnap {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what,
                                          size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path, ": ",
                                            std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is not a regular file"));
  }
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path, ": ",
                                              std::strerror(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is larger than ",
                                                     max_bytes, " bytes"));
    }
  }
  ::close(fd);
  return out;
}

}  // namespace gradsnap
