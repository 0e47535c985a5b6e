#include "storage/segment_writer.h"

#include <liburing.h>
#include <sys/uio.h>

#include <cerrno>
#include <mutex>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/thread_priority.h"
#include "storage/aligned_buffer.h"
#include "storage/storage_stats.h"

namespace gradsnap {
namespace storage {
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
  } else {
    try {
      w->ring_thread_ = std::thread([p = w.get()] { p->RingLoop(); });
    } catch (const std::system_error& e) {  // out of threads: RLIMIT_NPROC, a pids cgroup
      w->CloseRing();
      LogFallbackOnce(absl::StrCat("no thread for the ring: ", e.what()));
    }
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
  // A registered (fixed) file spares the kernel a file-table lookup and reference count per
  // write. Optional: where registration fails (old kernel, limits) the descriptor is used.
  const int fd = file_->fd();
  fixed_file_ = io_uring_register_files(ring, &fd, 1) == 0;
  // A sparse table of fixed buffers, filled as buffers are first written from (FixedSlotFor).
  // Optional like the file: where the kernel refuses it every write is a plain one.
  if (io_uring_register_buffers_sparse(ring, kFixedSlots) == 0) fixed_slots_.resize(kFixedSlots);
  return absl::OkStatus();
}

SegmentWriter::~SegmentWriter() {
  Wait().IgnoreError();
  if (ring_ != nullptr) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    ring_thread_.join();
    CloseRing();
  }
}

void SegmentWriter::CloseRing() {
  // The ring's own teardown is asynchronous: without this, the registered file could stay
  // open (for writing) a moment after the writer is gone, e.g. keeping a read-only remount
  // of its file system busy.
  if (fixed_file_) io_uring_unregister_files(ring_);
  if (!fixed_slots_.empty()) io_uring_unregister_buffers(ring_);  // unpins them now
  io_uring_queue_exit(ring_);
  delete ring_;
  ring_ = nullptr;
}

uint64_t SegmentWriter::end() const {
  absl::MutexLock lock(&mu_);
  return end_;
}

void SegmentWriter::Append(const uint8_t* data, size_t len, DoneFn done,
                           const AlignedBuffer* buffer) {
  auto* r = new Request{data, len, 0, 0, std::move(done)};
  if (buffer != nullptr && len >= kMinFixedBytes && data >= buffer->data() &&
      data + len <= buffer->data() + buffer->capacity()) {
    r->buffer_id = buffer->id();
    r->buffer_base = buffer->data();
    r->buffer_len = buffer->capacity();
  }
  absl::Status fail;
  {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
    if (!error_.ok()) {
      fail = error_;
    } else if (len % kIoAlignment != 0) {
      fail = absl::InvalidArgumentError("unaligned segment append");
    } else {
      r->offset = end_;
      end_ += len;
      if (ring_ != nullptr) {
        queue_.push_back(r);
        return;
      }
    }
  }
  if (fail.ok()) fail = Annotate(file_->Write(r->offset, r->data, r->len), path_);
  Finish(r, fail);
}

// Runs `done` outside mu_, then accounts the request as finished.
void SegmentWriter::Finish(Request* r, const absl::Status& s) {
  if (r->slot >= 0) --fixed_slots_[static_cast<size_t>(r->slot)].users;  // ring thread
  r->done(s, r->offset);
  delete r;
  absl::MutexLock lock(&mu_);
  if (!s.ok() && error_.ok()) error_ = s;
  --outstanding_;
}

void SegmentWriter::RingLoop() {
  EnterRole(ThreadRole::kBackground);
  for (;;) {
    std::deque<Request*> ready;
    {
      absl::MutexLock lock(&mu_);
      if (inflight_ == 0 && retry_.empty()) {
        // Idle: sleep until there is work or we are told to stop.
        mu_.Await(absl::Condition(
            +[](SegmentWriter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return w->stop_ || !w->queue_.empty();
            },
            this));
        if (queue_.empty() && stop_) return;
      }
      ready.swap(queue_);
      if (!error_.ok() || broken_) {
        // Sticky error: fail queued requests without touching the disk.
        absl::Status err = error_.ok() ? absl::InternalError("io_uring ring broken") : error_;
        mu_.Unlock();
        for (Request* r : ready) Finish(r, err);
        mu_.Lock();
        ready.clear();
      }
    }
    Prepare(&ready);
    Submit();
    if (inflight_ > 0) Reap();
    if (broken_) {
      // Retries can no longer be written either.
      std::deque<Request*> dead;
      dead.swap(retry_);
      for (Request* r : dead) Finish(r, absl::InternalError("io_uring ring broken"));
    }
    if (!ready.empty()) {
      // The ring was full: put the rest back in front, in order.
      absl::MutexLock lock(&mu_);
      queue_.insert(queue_.begin(), ready.begin(), ready.end());
    }
  }
}

// Fills SQEs (retries first) while fewer than queue_depth_ writes are in flight.
int SegmentWriter::Prepare(std::deque<Request*>* ready) {
  int n = 0;
  while (!broken_ && inflight_ < queue_depth_ && (!retry_.empty() || !ready->empty())) {
    std::deque<Request*>* from = retry_.empty() ? ready : &retry_;
    io_uring_sqe* sqe = io_uring_get_sqe(ring_);
    if (sqe == nullptr) break;  // SQ full until the next submit
    Request* r = from->front();
    from->pop_front();
    const int fd = fixed_file_ ? 0 : file_->fd();
    const auto len = static_cast<unsigned>(r->len - r->done_bytes);
    if (r->slot < 0) r->slot = FixedSlotFor(*r);  // a retried remainder keeps its slot
    if (r->slot >= 0) {
      io_uring_prep_write_fixed(sqe, fd, r->data + r->done_bytes, len,
                                r->offset + r->done_bytes, r->slot);
      StorageStats::Get().fixed_buffer_writes->Add();
    } else {
      io_uring_prep_write(sqe, fd, r->data + r->done_bytes, len, r->offset + r->done_bytes);
    }
    if (fixed_file_) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data(sqe, r);
    unsubmitted_.push_back(r);
    ++inflight_;
    ++n;
  }
  return n;
}

int SegmentWriter::FixedSlotFor(const Request& r) {
  if (r.buffer_id == 0 || fixed_slots_.empty()) return -1;
  int free_slot = -1;
  for (size_t i = 0; i < fixed_slots_.size(); ++i) {
    FixedSlot& s = fixed_slots_[i];
    if (s.id == r.buffer_id) {
      ++s.users;
      return static_cast<int>(i);
    }
    // An unused slot, the empty ones first; a slot in use by a prepared write is never replaced.
    if (s.users == 0 && (free_slot < 0 || s.id == 0)) free_slot = static_cast<int>(i);
  }
  if (free_slot < 0) return -1;
  iovec iov{const_cast<uint8_t*>(r.buffer_base), r.buffer_len};
  __u64 tag = 0;
  FixedSlot& s = fixed_slots_[static_cast<size_t>(free_slot)];
  if (io_uring_register_buffers_update_tag(ring_, static_cast<unsigned>(free_slot), &iov, &tag,
                                           1) != 1) {
    s.id = 0;  // the kernel refused this buffer (a limit): plain writes for it
    return -1;
  }
  s.id = r.buffer_id;
  s.users = 1;
  return free_slot;
}

void SegmentWriter::Submit() {
  for (int attempts = 0; !unsubmitted_.empty(); ++attempts) {
    int rc = io_uring_submit(ring_);
    if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && attempts < 10000) {
      if (inflight_ > static_cast<int>(unsubmitted_.size())) Reap();  // make room
      continue;
    }
    if (rc < 0) {
      // The kernel refuses the ring. Fail what never reached it and never submit again: the
      // stale SQEs die with the ring in the destructor.
      absl::Status s = PosixError(absl::StrCat("io_uring_submit ", path_), -rc);
      GS_LOG(ERROR) << s;
      broken_ = true;
      std::vector<Request*> failed(unsubmitted_.begin(), unsubmitted_.end());
      inflight_ -= static_cast<int>(failed.size());
      unsubmitted_.clear();
      for (Request* r : failed) Finish(r, s);
      return;
    }
    unsubmitted_.erase(unsubmitted_.begin(), unsubmitted_.begin() + rc);
  }
}

// Waits for one completion, then takes every other one that is ready.
void SegmentWriter::Reap() {
  io_uring_cqe* cqe = nullptr;
  int rc = io_uring_wait_cqe(ring_, &cqe);
  while (rc == 0 && cqe != nullptr) {
    auto* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
    int res = file_->OnUringCompletion(r->offset + r->done_bytes, r->len - r->done_bytes,
                                       cqe->res);
    io_uring_cqe_seen(ring_, cqe);
    --inflight_;
    Complete(r, res);
    cqe = nullptr;
    rc = io_uring_peek_cqe(ring_, &cqe);
  }
}

void SegmentWriter::Complete(Request* r, int res) {
  if (res == -EAGAIN || res == -EINTR || (res > 0 && r->done_bytes + res < r->len)) {
    if (res > 0) r->done_bytes += static_cast<size_t>(res);
    retry_.push_back(r);  // short write: requeue the remainder
    return;
  }
  absl::Status s;
  if (res < 0) s = PosixError(absl::StrCat("io_uring write ", path_), -res);
  if (res == 0) s = PosixError(absl::StrCat("io_uring write ", path_), EIO);
  Finish(r, s);
}

absl::Status SegmentWriter::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &outstanding_));
  return error_;
}

absl::Status SegmentWriter::Sync() {
  RETURN_IF_ERROR(Wait());
  absl::Status s = file_->Sync();
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    if (error_.ok()) error_ = s;
  }
  return s;
}

}  // namespace storage
}  // namespace gradsnap
