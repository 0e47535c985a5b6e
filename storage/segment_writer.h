// Append-only segment file writer: io_uring with O_DIRECT, or pwrite.
//
// OVERVIEW
//   A segment file is a sequence of chunk records, each padded to 4 KiB (docs/format.md,
//   "Segment files"). Append() reserves the next offset and queues the write; up to
//   queue_depth writes are in flight. With io_uring the loop is liburing's: Prepare() fills an
//   SQE, Submit() hands all prepared SQEs to the kernel in one call (batched: the caller says
//   when more appends follow), Reap() collects completions, Complete() finishes or requeues one.
//   Without io_uring (disabled, setup failed, or a File without a descriptor such as the
//   fault-injecting file system) each Append is a positional write on the calling thread.
//
// ERROR HANDLING
//   Short writes and -EAGAIN/-EINTR are requeued for the remainder. Any other failure is
//   sticky: the first error is kept, every later Append/Sync returns it (ENOSPC becomes
//   RESOURCE_EXHAUSTED). Sync() waits for every write, then fdatasyncs; only after a successful
//   Sync() may metadata reference the bytes. Every request's `done` callback runs exactly once
//   (with ok or not) before Sync() or the destructor returns, so buffers always go back.
//
// THREAD SAFETY
//   Thread-safe: encode threads append concurrently. The ring is only touched under mu_.
#ifndef GRADSNAP_STORAGE_SEGMENT_WRITER_H_
#define GRADSNAP_STORAGE_SEGMENT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  // Creates (truncating) the segment file at `path`.
  static absl::StatusOr<std::unique_ptr<SegmentWriter>> Create(FileSystem* fs,
                                                               const std::string& path,
                                                               const SegmentWriterOptions& o);
  ~SegmentWriter();

  // Queues data[0, len) at the end of the file and returns its offset. `len` must be a
  // multiple of 4 KiB and `data` 4 KiB aligned; the bytes must stay valid until `done` runs.
  // `more_coming` true lets the writer delay submission to batch it with the next append.
  absl::StatusOr<uint64_t> Append(const uint8_t* data, size_t len,
                                  std::function<void(const absl::Status&, uint64_t)> done,
                                  bool more_coming);
  // Submits anything prepared and waits for every queued write (no fdatasync).
  absl::Status Wait();
  // Wait(), then fdatasync.
  absl::Status Sync();
  // Bytes reserved so far (the next append's offset).
  uint64_t end() const;
  bool uses_io_uring() const { return ring_ != nullptr; }

 private:
  struct Request;
  SegmentWriter(std::unique_ptr<File> file, std::string path);
  absl::Status SetupRing(int queue_depth);
  void Prepare(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Submit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reap(bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(Request* r, int res) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteSync(Request* r);

  // Constant after construction.
  const std::unique_ptr<File> file_;
  const std::string path_;
  int queue_depth_ = 1;
  io_uring* ring_ = nullptr;

  mutable absl::Mutex mu_;
  uint64_t end_ ABSL_GUARDED_BY(mu_) = 0;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;   // queued or running, not completed
  int prepared_ ABSL_GUARDED_BY(mu_) = 0;   // prepared, not yet submitted
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_SEGMENT_WRITER_H_
