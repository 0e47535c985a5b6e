#include "storage/uring_reader.h"

#include <liburing.h>
#include <sys/uio.h>

#include <cerrno>
#include <chrono>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace gradsnap {
namespace storage {

absl::StatusOr<std::unique_ptr<UringReader>> UringReader::Create(std::vector<File*> files,
                                                                 std::vector<std::string> names,
                                                                 int queue_depth, int buffers) {
  for (File* f : files) {
    if (f->fd() < 0) return absl::UnimplementedError("file system has no descriptors");
  }
  std::unique_ptr<UringReader> r(new UringReader(std::move(files), std::move(names)));
  RETURN_IF_ERROR(r->Setup(queue_depth, buffers));  // on failure r is destroyed without a ring
  try {
    r->reaper_ = std::thread([p = r.get()] { p->ReapLoop(); });
  } catch (const std::system_error& e) {  // out of threads (RLIMIT_NPROC, a pids cgroup)
    return absl::ResourceExhaustedError(absl::StrCat("io_uring reader thread: ", e.what()));
  }
  return r;
}

UringReader::UringReader(std::vector<File*> files, std::vector<std::string> names)
    : files_(std::move(files)), names_(std::move(names)) {}

absl::Status UringReader::Setup(int queue_depth, int buffers) {
  depth_ = queue_depth < 1 ? 1 : queue_depth;
  auto* ring = new io_uring;
  // One spare entry for the NOP that wakes the reaper at shutdown.
  int rc = io_uring_queue_init(static_cast<unsigned>(depth_ + 1), ring, 0);
  if (rc < 0) {
    delete ring;
    return PosixError("io_uring_queue_init", -rc);
  }
  ring_ = ring;
  ext_arg_ = (ring->features & IORING_FEAT_EXT_ARG) != 0;
  std::vector<int> fds;
  for (File* f : files_) fds.push_back(f->fd());
  // Registered files and buffers only save per-I/O work: without them reads still work.
  fixed_files_ = !fds.empty() &&
                 io_uring_register_files(ring_, fds.data(), static_cast<unsigned>(fds.size())) == 0;
  if (buffers > 0 && io_uring_register_buffers_sparse(ring_, static_cast<unsigned>(buffers)) == 0) {
    absl::MutexLock lock(&mu_);
    fixed_buffer_.assign(static_cast<size_t>(buffers), false);
  }
  return absl::OkStatus();
}

UringReader::~UringReader() {
  if (ring_ == nullptr) return;  // Setup failed: no ring, no reaper
  if (reaper_.joinable()) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](UringReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
          return r->inflight_ == 0 && r->pending_.empty();
        },
        this));
    stop_.store(true);
    // Wake the reaper with a NOP (user data nullptr); on a broken ring it flushes the failed
    // submit's entries too, NOPs by now. If it cannot be submitted the reaper sees stop_ at its
    // next timed wake-up (kReapWakeMs; kernels with IORING_FEAT_EXT_ARG, Linux 5.11+).
    io_uring_sqe* sqe = io_uring_get_sqe(ring_);
    if (sqe != nullptr) {
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      if (io_uring_submit(ring_) < 0) GS_LOG(WARNING) << "io_uring reader: no wake-up NOP";
    }
  }
  if (reaper_.joinable()) reaper_.join();
  // Closing the ring drops SQEs the kernel never took without running them.
  io_uring_queue_exit(ring_);
  delete ring_;
}

bool UringReader::RegisterBuffer(int slot, uint8_t* buf, size_t n) {
  absl::MutexLock lock(&mu_);
  if (slot < 0 || static_cast<size_t>(slot) >= fixed_buffer_.size()) return false;
  iovec iov{buf, n};
  __u64 tag = 0;
  fixed_buffer_[slot] =
      io_uring_register_buffers_update_tag(ring_, static_cast<unsigned>(slot), &iov, &tag, 1) == 1;
  return fixed_buffer_[slot];
}

void UringReader::Read(int file, uint64_t offset, uint8_t* buf, size_t n, int slot,
                       DoneFn done) {
  auto* r = new Request{file, offset, buf, n, slot, 0, std::move(done)};
  std::vector<Request*> failed;
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    if (slot >= 0 && (static_cast<size_t>(slot) >= fixed_buffer_.size() || !fixed_buffer_[slot])) {
      r->slot = -1;
    }
    pending_.push_back(r);
    failed = SubmitLocked();
    why = broken_;
  }
  Fail(failed, why);
}

std::vector<UringReader::Request*> UringReader::SubmitLocked() {
  std::vector<Request*> out;
  if (!broken_.ok()) {
    out.assign(pending_.begin(), pending_.end());
    pending_.clear();
    return out;
  }
  std::vector<Request*> prepared;
  std::vector<io_uring_sqe*> sqes;
  while (!pending_.empty() && inflight_ < depth_) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_);
    if (sqe == nullptr) break;  // SQ full until the next submit
    Request* r = pending_.front();
    pending_.pop_front();
    const int fd = fixed_files_ ? r->file : files_[r->file]->fd();
    uint8_t* to = r->buf + r->got;
    const auto len = static_cast<unsigned>(r->n - r->got);
    if (r->slot >= 0) {
      io_uring_prep_read_fixed(sqe, fd, to, len, r->offset + r->got, r->slot);
    } else {
      io_uring_prep_read(sqe, fd, to, len, r->offset + r->got);
    }
    if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, r);
    prepared.push_back(r);
    sqes.push_back(sqe);
    ++inflight_;
  }
  size_t submitted = 0;
  for (int attempts = 0; submitted < prepared.size(); ++attempts) {
    int rc = io_uring_submit(ring_);
    if (rc > 0) {
      submitted += static_cast<size_t>(rc);
      continue;
    }
    if (rc == 0) break;  // nothing left in the queue to hand over: all of it went out
    if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && attempts < 1000) continue;
    // The kernel refuses the ring. What it never took fails, and so does everything after it.
    // Their SQEs stay in the submission queue (liburing published the tail before the enter):
    // they become NOPs the reaper ignores, so whatever submits on this ring later (the
    // destructor's wake-up NOP) never hands the kernel a read into a buffer its request no
    // longer owns. No read is submitted on this ring again.
    for (size_t i = submitted; i < sqes.size(); ++i) {
      io_uring_prep_nop(sqes[i]);
      io_uring_sqe_set_data(sqes[i], kStaleEntry);
    }
    broken_ = PosixError("io_uring_submit (read)", -rc);
    GS_LOG(ERROR) << broken_;
    out.assign(prepared.begin() + static_cast<std::ptrdiff_t>(submitted), prepared.end());
    inflight_ -= static_cast<int>(out.size());
    out.insert(out.end(), pending_.begin(), pending_.end());
    pending_.clear();
    break;
  }
  return out;
}

void UringReader::Fail(const std::vector<Request*>& reqs, const absl::Status& s) {
  for (Request* r : reqs) {
    r->done(s);
    delete r;
  }
}

void UringReader::ReapLoop() {
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    // A bounded wait where the kernel takes the timeout as an argument of the wait
    // (IORING_FEAT_EXT_ARG, Linux 5.11+), so a stop whose NOP could not be submitted is seen
    // too. Older kernels would need a timeout SQE, submitted from this thread outside mu_,
    // racing Read for the submission queue: they wait for the NOP.
    __kernel_timespec ts{0, kReapWakeMs * 1000000LL};
    int rc = ext_arg_ ? io_uring_wait_cqe_timeout(ring_, &cqe, &ts)
                      : io_uring_wait_cqe(ring_, &cqe);
    if (rc == -EINTR) continue;
    if (rc == -ETIME || rc == -EAGAIN) {
      if (stop_.load()) return;
      continue;
    }
    if (rc < 0) {
      // The kernel refuses the wait (a seccomp filter, say): nothing can complete until it
      // takes it again. Said once; polled at the idle pace, not spun, until the stop.
      if (!wait_refused_) GS_LOG(ERROR) << PosixError("io_uring reader: wait for completions", -rc);
      wait_refused_ = true;
      if (stop_.load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(kReapWakeMs));
      continue;
    }
    void* data = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(ring_, cqe);
    if (data == nullptr) return;       // the NOP of the destructor
    if (data == kStaleEntry) continue;  // an entry of a refused submit, made a NOP
    auto* r = static_cast<Request*>(data);
    res = files_[r->file]->OnUringRead(r->offset + r->got, r->buf + r->got, r->n - r->got, res);
    absl::Status status;
    Request* finished = Complete(r, res, &status);
    if (finished == nullptr) continue;
    if (status.ok()) {
      finished->done(finished->got);
    } else {
      finished->done(status);
    }
    delete finished;
  }
}

UringReader::Request* UringReader::Complete(Request* r, int res, absl::Status* status) {
  std::vector<Request*> failed;
  absl::Status why;
  Request* finished = nullptr;
  {
    absl::MutexLock lock(&mu_);
    --inflight_;
    if (res == -EAGAIN || res == -EINTR || (res > 0 && r->got + static_cast<size_t>(res) < r->n)) {
      if (res > 0) r->got += static_cast<size_t>(res);
      pending_.push_front(r);  // short read: the rest goes out first
    } else {
      finished = r;
      if (res > 0) r->got += static_cast<size_t>(res);
      if (res < 0) {
        *status = PosixError(absl::StrCat("io_uring read ", names_[r->file], " at offset ",
                                          r->offset + r->got),
                             -res);
      }
    }
    failed = SubmitLocked();
    why = broken_;
  }
  Fail(failed, why);
  return finished;
}

}  // namespace storage
}  // namespace gradsnap
