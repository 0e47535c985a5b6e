// Append-only segment file writer: io_uring with O_DIRECT, or pwrite.
//
// OVERVIEW
//   A segment file is a sequence of chunk records, each starting on a 4 KiB boundary
//   (docs/format.md, "Segment files"). Append() reserves the next offset and queues the write.
//   With io_uring, one thread per segment owns the ring and runs liburing's loop:
//     Prepare()  fill SQEs for queued requests while fewer than queue_depth are in flight,
//     Submit()   hand every prepared SQE to the kernel in one io_uring_enter (batched),
//                up to queue_depth writes in flight; the file is registered with the ring
//                (IOSQE_FIXED_FILE) where the kernel allows;
//     Reap()     wait for one completion, then peek the rest without blocking,
//     Complete() finish a request, or requeue the remainder of a short write.
//   Requests that arrive while the ring is busy wait in the queue and go out together with
//   the next submission. Without io_uring (disabled, setup failed, or a File without a
//   descriptor such as the fault-injecting file system) each Append is a positional write on
//   the calling thread, so concurrent appenders still overlap.
//
// ERROR HANDLING
//   Short writes and -EAGAIN/-EINTR are requeued for the remainder. Any other failure is
//   sticky: the first error is kept, every later request fails with it without touching the
//   disk, Wait()/Sync() return it (ENOSPC becomes RESOURCE_EXHAUSTED). Only after a
//   successful Sync() may metadata reference the bytes. Every request's `done` callback runs
//   exactly once, from the ring thread or the appending thread, never under a caller's lock.
//
// THREAD SAFETY
//   Thread-safe. The ring is touched only by its thread; mu_ guards the request queue.
#ifndef GRADSNAP_STORAGE_SEGMENT_WRITER_H_
#define GRADSNAP_STORAGE_SEGMENT_WRITER_H_

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
#include "storage/aligned_buffer.h"
#include "storage/file_system.h"

struct io_uring;

namespace gradsnap {
namespace storage {

struct SegmentWriterOptions {
  bool use_io_uring = true;
  bool use_direct_io = true;
  int queue_depth = 32;
};

class SegmentWriter {
 public:
  using DoneFn = std::function<void(const absl::Status&, uint64_t offset)>;
  // Creates (truncating) the segment file at `path`.
  static absl::StatusOr<std::unique_ptr<SegmentWriter>> Create(FileSystem* fs,
                                                               const std::string& path,
                                                               const SegmentWriterOptions& o);
  // Waits for queued writes, then stops the ring thread.
  ~SegmentWriter();

  // Queues data[0, len) at the end of the file; `done(status, offset)` runs when it is
  // written. `len` must be a multiple of 4 KiB and `data` 4 KiB aligned; the bytes must stay
  // valid until `done` runs. With `buffer` (the AlignedBuffer data lies in, kept alive as the
  // bytes are), the write goes out as a fixed-buffer write (io_uring_prep_write_fixed): the
  // buffer is registered with the ring on first use, in one of kFixedSlots slots keyed by its
  // id() (an address may come back for another buffer; an id never does), so the kernel pins
  // its pages once per ring, not once per write.
  void Append(const uint8_t* data, size_t len, DoneFn done,
              const AlignedBuffer* buffer = nullptr);
  // Waits until every queued write completed; returns the sticky error, if any.
  absl::Status Wait();
  // Wait(), then fdatasync.
  absl::Status Sync();
  // Bytes reserved so far (the next append's offset).
  uint64_t end() const;
  bool uses_io_uring() const { return ring_ != nullptr; }

 private:
  struct Request {
    const uint8_t* data;
    size_t len;
    uint64_t offset;
    size_t done_bytes;
    DoneFn done;
    uint64_t buffer_id = 0;            // AlignedBuffer::id(), 0: not a fixed-buffer candidate
    const uint8_t* buffer_base = nullptr;
    size_t buffer_len = 0;
    int slot = -1;                     // fixed-buffer slot while prepared (ring thread)
  };
  // A registered buffer: which one (id), and how many prepared writes use it.
  struct FixedSlot {
    uint64_t id = 0;
    int users = 0;
  };
  static constexpr int kFixedSlots = 16;
  static constexpr size_t kMinFixedBytes = 256 << 10;  // smaller writes: plain
  // The slot holding r's buffer, registering it in a free slot if need be; -1: a plain write.
  int FixedSlotFor(const Request& r);
  SegmentWriter(std::unique_ptr<File> file, std::string path);
  absl::Status SetupRing(int queue_depth);
  void CloseRing();  // unregisters the file, tears the ring down; ring_ becomes null
  void RingLoop();
  int Prepare(std::deque<Request*>* ready);
  void Submit();
  void Reap();
  void Complete(Request* r, int res);
  void Finish(Request* r, const absl::Status& s);

  // Constant after construction.
  const std::unique_ptr<File> file_;
  const std::string path_;
  int queue_depth_ = 1;
  io_uring* ring_ = nullptr;
  bool fixed_file_ = false;  // the file is registered with the ring as index 0
  std::thread ring_thread_;

  // Ring thread only.
  std::vector<FixedSlot> fixed_slots_;  // empty: the kernel refused a buffer table
  int inflight_ = 0;      // submitted or prepared, not completed
  std::deque<Request*> unsubmitted_;  // prepared SQEs, in ring order
  std::deque<Request*> retry_;
  bool broken_ = false;   // io_uring_submit failed hard: no more submissions

  mutable absl::Mutex mu_;
  uint64_t end_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Request*> queue_ ABSL_GUARDED_BY(mu_);  // waiting for the ring thread
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;         // appended, done not yet run
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_SEGMENT_WRITER_H_
