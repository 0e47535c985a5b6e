// LoadOrCreateNodeId (node_id.h).
#include "cluster/node_id.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/small_file.h"
#include "common/status.h"
#include "openssl/rand.h"

namespace gradsnap {
namespace cluster {

bool IsValidNodeId(absl::string_view id) {
  if (id.size() != 16) return false;
  for (char c : id) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

namespace {

absl::Status WriteDurably(const std::string& dir, const std::string& name,
                          const std::string& text) {
  const std::string tmp = absl::StrCat(dir, "/", name, ".tmp");
  const std::string path = absl::StrCat(dir, "/", name);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError(tmp, errno);
  const bool written = ::write(fd, text.data(), text.size()) ==
                       static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!written) return PosixError(tmp, err);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return PosixError(path, errno);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return PosixError(dir, errno);
  const bool synced = ::fsync(dfd) == 0;
  const int derr = errno;
  ::close(dfd);
  return synced ? absl::OkStatus() : PosixError(dir, derr);
}

}  // namespace

absl::StatusOr<std::string> LoadOrCreateNodeId(const std::string& data_dir) {
  const std::string path = absl::StrCat(data_dir, "/", kNodeIdFile);
  if (::access(path.c_str(), F_OK) == 0) {
    ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, "node id file", 64));
    std::string id(absl::StripAsciiWhitespace(text));
    if (!IsValidNodeId(id)) {
      return absl::DataLossError(absl::StrCat(
          path, " does not hold a node id (16 hex digits); restore it or move it away to "
                "join the cluster as a new node"));
    }
    return id;
  }
  if (errno != ENOENT) return PosixError(path, errno);
  unsigned char bytes[8];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("no random bytes for a node id");
  }
  std::string id;
  for (unsigned char b : bytes) id += absl::StrFormat("%02x", b);
  RETURN_IF_ERROR(WriteDurably(data_dir, kNodeIdFile, id + "\n"));
  return id;
}

}  // namespace cluster
}  // namespace gradsnap
