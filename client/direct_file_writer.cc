#include "client/direct_file_writer.h"

#include <fcntl.h>
#include <sys/vfs.h>

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
constexpr int64_t kTmpfsMagic = 0x01021994;  // TMPFS_MAGIC, <linux/magic.h>

bool OnTmpfs(const storage::File& f) {
  struct statfs st;
  return f.fd() >= 0 && ::fstatfs(f.fd(), &st) == 0 &&
         static_cast<int64_t>(st.f_type) == kTmpfsMagic;
}

// Allocates `bytes` (rounded up to a block) of an O_DIRECT file with a descriptor; see the
// header for why, and why not on tmpfs. Only ENOSPC fails: elsewhere it is a hint.
absl::Status Preallocate(storage::File& f, const std::string& path, uint64_t bytes) {
  if (bytes == 0 || f.fd() < 0 || !f.direct() || OnTmpfs(f)) return absl::OkStatus();
  const off_t len = static_cast<off_t>((bytes + kAlign - 1) / kAlign * kAlign);
  if (::fallocate(f.fd(), 0, 0, len) == 0 || errno != ENOSPC) return absl::OkStatus();
  return PosixError(absl::StrCat("allocate ", bytes, " bytes for ", path), ENOSPC);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DirectFileWriter>> DirectFileWriter::Create(
    const std::string& path, storage::FileSystem* fs, uint64_t expected_bytes, bool exclusive) {
  storage::OpenOptions o;
  o.write = o.create = o.truncate = o.direct = true;
  o.exclusive = exclusive;
  ASSIGN_OR_RETURN(std::unique_ptr<storage::File> file, fs->Open(path, o));
  RETURN_IF_ERROR(Preallocate(*file, path, expected_bytes));
  if (!file->direct()) {  // the file system refused O_DIRECT at open (EINVAL)
    GS_LOG(WARNING) << "writing " << path
                    << " through the page cache: its file system refuses O_DIRECT";
  }
  const bool tmpfs = OnTmpfs(*file);
  return std::unique_ptr<DirectFileWriter>(
      new DirectFileWriter(fs, path, std::move(file), tmpfs));
}

DirectFileWriter::DirectFileWriter(storage::FileSystem* fs, std::string path,
                                   std::unique_ptr<storage::File> file, bool any_alignment)
    : fs_(fs), path_(std::move(path)), file_(std::move(file)), direct_(file_->direct()),
      any_alignment_(any_alignment) {
  for (int i = 0; i < kBuffers; ++i) {
    void* p = nullptr;
    GS_CHECK(::posix_memalign(&p, kAlign, kBufferBytes) == 0) << "out of memory";
    storage_.emplace_back(static_cast<uint8_t*>(p), &std::free);
  }
  cur_.data = storage_[0].get();
  for (int i = 1; i < kBuffers; ++i) free_.push_back(storage_[i].get());
  // A file that takes any alignment is written through the page cache (tmpfs's O_DIRECT is
  // that too): each write holds the inode lock for its copy, so a second writer only waits.
  const int writers = lends() ? 1 : kWriters;
  for (int i = 0; i < writers; ++i) threads_.emplace_back([this] { Loop(); });
}

DirectFileWriter::~DirectFileWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<storage::File> DirectFileWriter::CurrentFile() {
  absl::MutexLock lock(&file_mu_);
  return file_;
}

absl::StatusOr<std::shared_ptr<storage::File>> DirectFileWriter::FallBackToBuffered(
    const std::shared_ptr<storage::File>& refused, const absl::Status& why) {
  absl::MutexLock lock(&file_mu_);
  if (file_ != refused) return file_;  // another writer thread fell back already
  storage::OpenOptions o;
  o.write = true;  // not truncated: the blocks written O_DIRECT so far stay
  ASSIGN_OR_RETURN(std::unique_ptr<storage::File> f, fs_->Open(path_, o));
  GS_LOG(WARNING) << "writing " << path_ << " through the page cache from now on: an O_DIRECT "
                  << "write was refused (" << why.message() << ")";
  file_ = std::move(f);
  direct_ = false;
  return file_;
}

absl::Status DirectFileWriter::WriteBuffer(const Buffer& b) {
  std::shared_ptr<storage::File> f = CurrentFile();
  absl::Status s = f->Write(b.offset, b.data, b.len);
  if (s.ok() || !f->direct() || !absl::IsInvalidArgument(s)) return s;
  ASSIGN_OR_RETURN(f, FallBackToBuffered(f, s));
  return f->Write(b.offset, b.data, b.len);
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
    const bool lent = b.hold != nullptr;
    b.hold.reset();  // lent bytes go back to their owner as soon as they are written
    absl::MutexLock lock(&mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    if (lent) {
      --lent_;
    } else {
      free_.push_back(b.data);
    }
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

absl::Status DirectFileWriter::AppendLent(const void* data, size_t n,
                                          std::shared_ptr<const void> hold) {
  if (closed_) return absl::FailedPreconditionError("DirectFileWriter already finished");
  if (!lends() || hold == nullptr || n == 0) return Append(data, n);
  if (cur_.len > 0) RETURN_IF_ERROR(Submit());  // the staged bytes first, at their offset
  Buffer b;
  b.data = const_cast<uint8_t*>(static_cast<const uint8_t*>(data));  // only read
  b.len = n;
  b.offset = cur_.offset;
  b.hold = std::move(hold);
  cur_.offset += n;
  appended_ += n;
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  queue_.push_back(std::move(b));
  ++lent_;
  mu_.Await(absl::Condition(
      +[](DirectFileWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
        return w->lent_ < kMaxLent || !w->error_.ok();
      },
      this));
  return error_;
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
  std::shared_ptr<storage::File> f = CurrentFile();
  RETURN_IF_ERROR(f->Truncate(appended_));
  RETURN_IF_ERROR(f->Sync());
  absl::MutexLock lock(&file_mu_);
  file_.reset();  // closes it
  return absl::OkStatus();
}

}  // namespace client
}  // namespace gradsnap
