#include "storage/segment_writer.h"

#include <liburing.h>

#include <cerrno>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"

namespace gradsnap {
namespace storage {

struct SegmentWriter::Request {
  const uint8_t* data;
  size_t len;
  uint64_t offset;
  size_t done_bytes = 0;
  std::function<void(const absl::Status&, uint64_t)> done;
};

namespace {
void LogFallbackOnce(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] { GS_LOG(WARNING) << "storage: using pwrite, not io_uring: " << why; });
}
}  // namespace

absl::StatusOr<std::unique_ptr<SegmentWriter>> SegmentWriter::Create(
    FileSystem* fs, const std::string& path, const SegmentWriterOptions& o) {
  OpenOptions oo;
  oo.write = oo.create = oo.truncate = true;
  oo.direct = o.use_direct_io;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs->Open(path, oo));
  std::unique_ptr<SegmentWriter> w(new SegmentWriter(std::move(file), path));
  if (!o.use_io_uring) {
    LogFallbackOnce("disabled by options");
  } else if (w->file_->fd() < 0) {
    LogFallbackOnce("file system has no descriptors");
  } else if (absl::Status s = w->SetupRing(o.queue_depth); !s.ok()) {
    LogFallbackOnce(std::string(s.message()));
  }
  return w;
}

SegmentWriter::SegmentWriter(std::unique_ptr<File> file, std::string path)
    : file_(std::move(file)), path_(std::move(path)) {}

absl::Status SegmentWriter::SetupRing(int queue_depth) {
  queue_depth_ = queue_depth < 1 ? 1 : queue_depth;
  auto* ring = new io_uring;
  int rc = io_uring_queue_init(static_cast<unsigned>(queue_depth_), ring, 0);
  if (rc < 0) {
    delete ring;
    return PosixError("io_uring_queue_init", -rc);
  }
  ring_ = ring;
  return absl::OkStatus();
}

SegmentWriter::~SegmentWriter() {
  absl::MutexLock lock(&mu_);
  Drain();
  if (ring_ != nullptr) {
    io_uring_queue_exit(ring_);
    delete ring_;
  }
}

uint64_t SegmentWriter::end() const {
  absl::MutexLock lock(&mu_);
  return end_;
}

absl::StatusOr<uint64_t> SegmentWriter::Append(const uint8_t* data, size_t len,
                                               std::function<void(const absl::Status&, uint64_t)> done,
                                               bool more_coming) {
  auto* r = new Request{data, len, 0, 0, std::move(done)};
  absl::MutexLock lock(&mu_);
  if (!error_.ok() || len % kIoAlignment != 0) {
    absl::Status s = error_.ok() ? absl::InvalidArgumentError("unaligned segment append") : error_;
    r->done(s, 0);
    delete r;
    return s;
  }
  r->offset = end_;
  end_ += len;
  ++inflight_;
  if (ring_ == nullptr) {
    mu_.Unlock();  // positional writes of disjoint ranges run in parallel
    absl::Status s = WriteSync(r);
    mu_.Lock();
    if (!s.ok() && error_.ok()) error_ = s;
    uint64_t offset = r->offset;
    r->done(s, offset);
    delete r;
    --inflight_;
    if (!s.ok()) return s;
    return offset;
  }
  uint64_t offset = r->offset;
  while (inflight_ > queue_depth_ && error_.ok()) Reap(/*wait=*/true);
  Prepare(r);
  if (!more_coming || prepared_ >= 8) Submit();
  Reap(/*wait=*/false);
  if (!error_.ok()) return error_;
  return offset;
}

absl::Status SegmentWriter::WriteSync(Request* r) {
  absl::Status s = file_->Write(r->offset, r->data, r->len);
  return Annotate(s, path_);
}

// Fills one SQE for the rest of `r`. The ring has queue_depth_ entries and at most
// queue_depth_ requests are outstanding, so an SQE is always available after a Submit().
void SegmentWriter::Prepare(Request* r) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_);
  if (sqe == nullptr) {
    Submit();
    sqe = io_uring_get_sqe(ring_);
  }
  GS_CHECK(sqe != nullptr) << "io_uring SQ full with " << inflight_ << " in flight";
  io_uring_prep_write(sqe, file_->fd(), r->data + r->done_bytes,
                      static_cast<unsigned>(r->len - r->done_bytes), r->offset + r->done_bytes);
  io_uring_sqe_set_data(sqe, r);
  ++prepared_;
}

void SegmentWriter::Submit() {
  if (prepared_ == 0) return;
  int rc;
  do {
    rc = io_uring_submit(ring_);
  } while (rc == -EINTR || rc == -EAGAIN);
  if (rc < 0) {
    // The prepared SQEs stay in the ring; record the error so nothing more is queued.
    if (error_.ok()) error_ = PosixError(absl::StrCat("io_uring_submit ", path_), -rc);
    return;
  }
  prepared_ -= rc;
}

void SegmentWriter::Reap(bool wait) {
  if (wait) Submit();  // never wait on a completion of an unsubmitted write
  for (bool first = true; inflight_ > 0; first = false) {
    io_uring_cqe* cqe = nullptr;
    int rc = (wait && first) ? io_uring_wait_cqe(ring_, &cqe) : io_uring_peek_cqe(ring_, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0 || cqe == nullptr) {
      if (wait && first && rc != -EAGAIN && error_.ok()) {
        error_ = PosixError(absl::StrCat("io_uring_wait_cqe ", path_), -rc);
      }
      return;
    }
    auto* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
    int res = cqe->res;
    io_uring_cqe_seen(ring_, cqe);
    Complete(r, res);
    if (wait && first && prepared_ > 0) Submit();  // requeued remainders
  }
}

void SegmentWriter::Complete(Request* r, int res) {
  if (res == -EAGAIN || res == -EINTR || (res > 0 && r->done_bytes + res < r->len)) {
    if (res > 0) r->done_bytes += static_cast<size_t>(res);
    Prepare(r);  // short write: requeue the remainder
    Submit();
    return;
  }
  absl::Status s;
  if (res < 0) {
    s = PosixError(absl::StrCat("io_uring write ", path_), -res);
  } else if (res == 0) {
    s = PosixError(absl::StrCat("io_uring write ", path_), EIO);
  }
  if (!s.ok() && error_.ok()) error_ = s;
  r->done(s, r->offset);
  delete r;
  --inflight_;
}

void SegmentWriter::Drain() {
  if (ring_ != nullptr) {
    Submit();
    while (inflight_ > 0) {
      if (prepared_ > 0 && !error_.ok()) {
        // Submission itself failed: these SQEs never reach the kernel.
        break;
      }
      Reap(/*wait=*/true);
    }
  } else {
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &inflight_));
  }
}

absl::Status SegmentWriter::Wait() {
  absl::MutexLock lock(&mu_);
  Drain();
  return error_;
}

absl::Status SegmentWriter::Sync() {
  absl::MutexLock lock(&mu_);
  Drain();
  if (!error_.ok()) return error_;
  absl::Status s = file_->Sync();
  if (!s.ok()) error_ = s;
  return s;
}

}  // namespace storage
}  // namespace gradsnap
