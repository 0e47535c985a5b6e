#include "client/direct_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace gradsnap {
namespace client {
namespace {

constexpr size_t kAlign = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<DirectFileWriter>> DirectFileWriter::Create(
    const std::string& path) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  bool direct = true;
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) {  // the file system does not support O_DIRECT
    direct = false;
    fd = ::open(path.c_str(), flags, 0644);
  }
  if (fd < 0) return PosixError(absl::StrCat("open ", path), errno);
  return std::unique_ptr<DirectFileWriter>(new DirectFileWriter(fd, direct, path));
}

DirectFileWriter::DirectFileWriter(int fd, bool direct, std::string path)
    : fd_(fd), direct_(direct), path_(std::move(path)) {
  for (int i = 0; i < kBuffers; ++i) {
    void* p = nullptr;
    GS_CHECK(::posix_memalign(&p, kAlign, kBufferBytes) == 0) << "out of memory";
    storage_.emplace_back(static_cast<uint8_t*>(p), &std::free);
  }
  cur_.data = storage_[0].get();
  for (int i = 1; i < kBuffers; ++i) free_.push_back(storage_[i].get());
  for (int i = 0; i < kWriters; ++i) threads_.emplace_back([this] { Loop(); });
}

DirectFileWriter::~DirectFileWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
  if (!closed_) ::close(fd_);
}

absl::Status DirectFileWriter::WriteBuffer(const Buffer& b) {
  size_t done = 0;
  while (done < b.len) {
    ssize_t w = ::pwrite(fd_, b.data + done, b.len - done, static_cast<off_t>(b.offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return PosixError(absl::StrCat("write ", path_), errno);
    }
    if (w == 0) return absl::DataLossError(absl::StrCat("write ", path_, ": no progress"));
    done += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

void DirectFileWriter::Loop() {
  for (;;) {
    Buffer b;
    bool failed = false;  // after an error, buffers are only recycled
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DirectFileWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->stop_ || !w->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      b = queue_.front();
      queue_.pop_front();
      ++busy_;
      failed = !error_.ok();
    }
    absl::Status s = failed ? absl::OkStatus() : WriteBuffer(b);
    absl::MutexLock lock(&mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    free_.push_back(b.data);
    --busy_;
  }
}

absl::Status DirectFileWriter::Submit() {
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  queue_.push_back(cur_);
  mu_.Await(absl::Condition(
      +[](DirectFileWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
        return !w->free_.empty();
      },
      this));
  cur_.offset += cur_.len;
  cur_.len = 0;
  cur_.data = free_.back();
  free_.pop_back();
  return error_;
}

absl::Status DirectFileWriter::Append(const void* data, size_t n) {
  if (closed_) return absl::FailedPreconditionError("DirectFileWriter already finished");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    size_t take = std::min(n, kBufferBytes - cur_.len);
    std::memcpy(cur_.data + cur_.len, p, take);
    cur_.len += take;
    appended_ += take;
    p += take;
    n -= take;
    if (cur_.len == kBufferBytes) RETURN_IF_ERROR(Submit());
  }
  return absl::OkStatus();
}

absl::Status DirectFileWriter::Finish() {
  if (closed_) return absl::FailedPreconditionError("DirectFileWriter already finished");
  if (cur_.len > 0) {
    // O_DIRECT writes whole 4 KiB blocks: pad with zeros, then cut the file to its length.
    size_t padded = (cur_.len + kAlign - 1) / kAlign * kAlign;
    std::memset(cur_.data + cur_.len, 0, padded - cur_.len);
    cur_.len = padded;
    RETURN_IF_ERROR(Submit());
  }
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](DirectFileWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
          return w->queue_.empty() && w->busy_ == 0;
        },
        this));
    RETURN_IF_ERROR(error_);
  }
  closed_ = true;
  absl::Status s;
  if (::ftruncate(fd_, static_cast<off_t>(appended_)) != 0) {
    s = PosixError(absl::StrCat("truncate ", path_), errno);
  }
  if (s.ok() && ::fdatasync(fd_) != 0) s = PosixError(absl::StrCat("fdatasync ", path_), errno);
  if (::close(fd_) != 0 && s.ok()) s = PosixError(absl::StrCat("close ", path_), errno);
  return s;
}

}  // namespace client
}  // namespace gradsnap
