// UringReader: positional reads of a few files through one io_uring, for the shard reader.
//
// OVERVIEW
//   Read() queues a request and, while fewer than queue_depth reads are in flight, fills SQEs
//   and submits them with one io_uring_enter (reads queued together go out together). One
//   thread per reader reaps completions and runs each request's `done`; a completion frees a
//   slot, so the next queued reads are submitted right away. The files are registered with the
//   ring (IOSQE_FIXED_FILE) and so are the callers' buffers (RegisterBuffer, read_fixed) where
//   the kernel allows it: no per-I/O file lookup and no per-I/O page pinning.
//
// ERROR HANDLING
//   A short read or -EAGAIN/-EINTR resubmits the rest; a read of 0 bytes ends the request at
//   end of file (`done` gets the bytes read, fewer than asked). Any other error is the request's
//   Status (PosixError: EIO becomes DATA_LOSS naming the file and offset). If the kernel refuses
//   the ring, that request and every later one fail, and no read is submitted on it again
//   (its unsubmitted SQEs become NOPs, so nothing submitted later runs them). Every completion
//   goes through
//   File::OnUringRead, so a fault-injecting file system can shorten it or turn it into an error.
//   Every `done` runs exactly once, from the reaping thread or from Read(), never under mu_.
//
// THREAD SAFETY
//   Thread-safe. The submission queue is touched under mu_, the completion queue only by the
//   reaping thread. The destructor waits for every queued read.
#ifndef GRADSNAP_STORAGE_URING_READER_H_
#define GRADSNAP_STORAGE_URING_READER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

struct io_uring;

namespace gradsnap {
namespace storage {

class UringReader {
 public:
  // `got`: the bytes read, fewer than asked only at end of file.
  using DoneFn = std::function<void(absl::StatusOr<size_t> got)>;

  // `files` (with real descriptors, fd() >= 0) must outlive the reader; `names` name them in
  // errors. `buffers` is how many buffer slots RegisterBuffer may fill. Fails where io_uring is
  // unavailable (the caller then reads with File::Read).
  static absl::StatusOr<std::unique_ptr<UringReader>> Create(std::vector<File*> files,
                                                             std::vector<std::string> names,
                                                             int queue_depth, int buffers);
  ~UringReader();
  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;

  // Registers buf[0, n) as fixed buffer `slot` (< buffers), replacing what was there. Returns
  // false where the kernel refuses (e.g. RLIMIT_MEMLOCK); reads into it then use plain reads.
  bool RegisterBuffer(int slot, uint8_t* buf, size_t n);
  // Reads file `file` [offset, offset + n) into buf, which lies inside fixed buffer `slot`
  // (-1: none). buf must stay valid until `done` runs.
  void Read(int file, uint64_t offset, uint8_t* buf, size_t n, int slot, DoneFn done);

 private:
  struct Request {
    int file;
    uint64_t offset;
    uint8_t* buf;
    size_t n;
    int slot;
    size_t got = 0;
    DoneFn done;
  };
  UringReader(std::vector<File*> files, std::vector<std::string> names);
  absl::Status Setup(int queue_depth, int buffers);
  // Fills SQEs from pending_ and submits them; returns requests that cannot go out (ring
  // broken) for the caller to fail outside mu_.
  std::vector<Request*> SubmitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapLoop();
  // Acts on one completion; returns the request when it is finished.
  Request* Complete(Request* r, int res, absl::Status* status);
  static void Fail(const std::vector<Request*>& reqs, const absl::Status& s);

  const std::vector<File*> files_;
  const std::vector<std::string> names_;
  io_uring* ring_ = nullptr;
  bool ext_arg_ = false;  // the kernel takes a wait's timeout as an argument (5.11+)
  bool fixed_files_ = false;
  std::vector<bool> fixed_buffer_ ABSL_GUARDED_BY(mu_);  // per slot: registered
  std::thread reaper_;

  absl::Mutex mu_;
  int depth_ = 1;
  std::deque<Request*> pending_ ABSL_GUARDED_BY(mu_);
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // io_uring_submit failed hard
  bool wait_refused_ = false;      // reaper only: a failed wait was logged
  std::atomic<bool> stop_{false};  // the destructor runs: the reaper returns at its next wake
  static constexpr int kReapWakeMs = 100;  // the reaper's longest sleep while idle
  // User data of an entry of a refused submit, rewritten as a NOP: its completion is ignored.
  static inline void* const kStaleEntry = reinterpret_cast<void*>(uintptr_t{1});
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_URING_READER_H_
