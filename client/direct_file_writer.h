// DirectFileWriter: writes one new file sequentially at the speed of the disk, for exports.
//
// OVERVIEW
//   Append() copies bytes into 4 KiB-aligned staging buffers (kBufferBytes each); a full buffer
//   is handed to one of kWriters writer threads that pwrite()s it with O_DIRECT at its offset
//   while the producer fills the next one, so the disk works while the caller restores the next
//   bytes, several writes are in flight (one O_DIRECT write at a time reaches about a third of
//   what the disk takes), and no page cache write-back is involved. Finish() writes the last
//   partial buffer (zero-padded to 4 KiB), truncates the file to the exact length and
//   fdatasyncs it (the one sync of the file). Given the file's length up front, Create
//   allocates its blocks (fallocate): on ext4 and xfs O_DIRECT writes into allocated blocks
//   inside the file's size run under a shared inode lock, so the writers' writes are in flight
//   together, where writes that extend the file run one at a time; a full disk fails there,
//   before anything is read. Not on tmpfs, where fallocate zero-fills every page on one
//   thread before the first write (measured slower than letting the writers allocate).
//
// O_DIRECT FALLBACK
//   Where the file system refuses O_DIRECT at open (EINVAL: older tmpfs, some FUSE and network
//   file systems) the file is written through the page cache; where it takes O_DIRECT at open
//   but a write fails with EINVAL (an alignment it will not take) the file is reopened
//   buffered and that write and all later ones go through the page cache. Either way one
//   warning names the file and the reason; Finish's fdatasync covers the bytes of both modes.
//
// ERROR HANDLING
//   The first write error is sticky: Append and Finish return it. The file is left for the
//   caller to remove.
//
// LENT BYTES
//   AppendLent takes bytes the caller keeps valid (a `hold`) and queues them for the writer
//   threads as they are, without the staging copy, where the file takes writes of any
//   alignment: written through the page cache, or on tmpfs (which takes O_DIRECT at any
//   alignment). There a file write is the kernel's copy into its pages and nothing else, and
//   the producer verifies the next chunk while a writer thread writes this one. At most
//   kMaxLent pieces wait or are being written; the producer waits for one to finish beyond
//   that. Elsewhere (O_DIRECT on a disk) AppendLent copies like Append. Such a file gets one
//   writer thread, not kWriters: a write through the page cache holds the inode lock for its
//   copy, so more writers only wait for it (measured exporting 1 GiB to tmpfs on 2 cores:
//   2.5-2.7 GB/s with one writer, 2.4-2.5 with four).
//
// THREAD SAFETY
//   One producer thread at a time.
#ifndef GRADSNAP_CLIENT_DIRECT_FILE_WRITER_H_
#define GRADSNAP_CLIENT_DIRECT_FILE_WRITER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

namespace gradsnap {
namespace client {

class DirectFileWriter {
 public:
  static constexpr size_t kBufferBytes = 8u << 20;
  static constexpr int kWriters = 4;                // writes in flight
  static constexpr int kBuffers = kWriters + 2;     // one filling, one queued, kWriters writing

  // Creates (or truncates) `path`, mode 0644, through `fs` (tests pass a fault-injecting one).
  // With `exclusive`, only creates: ALREADY_EXISTS where `path` exists (see
  // storage::UniqueTempPath).
  static absl::StatusOr<std::unique_ptr<DirectFileWriter>> Create(
      const std::string& path, storage::FileSystem* fs = storage::FileSystem::Default(),
      uint64_t expected_bytes = 0, bool exclusive = false);
  ~DirectFileWriter();  // stops the writer threads and closes the file (does not remove it)
  DirectFileWriter(const DirectFileWriter&) = delete;
  DirectFileWriter& operator=(const DirectFileWriter&) = delete;

  static constexpr int kMaxLent = 8;               // lent pieces queued or being written

  absl::Status Append(const void* data, size_t n);
  // As Append, but where the file takes any alignment (see LENT BYTES) data[0, n) is written
  // from where it lies, kept valid by `hold` until then. A null `hold` copies, as Append.
  absl::Status AppendLent(const void* data, size_t n, std::shared_ptr<const void> hold);
  // Whether AppendLent writes lent bytes uncopied.
  bool lends() const { return any_alignment_ || !direct_.load(); }
  // Writes what is buffered, sets the file's exact size, fdatasyncs and closes it.
  absl::Status Finish();
  // Whether the writes go (went, once finished) O_DIRECT: false from the start where the
  // file system refused it at open, false after a fallback.
  bool direct() const { return direct_.load(); }

 private:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t len = 0;
    uint64_t offset = 0;  // file offset of data[0]
    std::shared_ptr<const void> hold;  // lent bytes (AppendLent): not a staging buffer
  };
  DirectFileWriter(storage::FileSystem* fs, std::string path,
                   std::unique_ptr<storage::File> file, bool any_alignment);
  void Loop();
  absl::Status Submit();  // queues cur_ and takes a free buffer
  absl::Status WriteBuffer(const Buffer& b);
  std::shared_ptr<storage::File> CurrentFile();
  // After `refused` (O_DIRECT) failed a write with `why`: the file reopened buffered (once,
  // whichever writer thread gets here first).
  absl::StatusOr<std::shared_ptr<storage::File>> FallBackToBuffered(
      const std::shared_ptr<storage::File>& refused, const absl::Status& why);

  storage::FileSystem* const fs_;
  const std::string path_;
  absl::Mutex file_mu_;
  std::shared_ptr<storage::File> file_ ABSL_GUARDED_BY(file_mu_);  // null once finished
  std::atomic<bool> direct_;
  const bool any_alignment_;  // tmpfs: O_DIRECT writes of any alignment
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> storage_;
  Buffer cur_;
  uint64_t appended_ = 0;
  bool closed_ = false;

  absl::Mutex mu_;
  std::deque<Buffer> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t*> free_ ABSL_GUARDED_BY(mu_);
  int busy_ ABSL_GUARDED_BY(mu_) = 0;  // buffers being written
  int lent_ ABSL_GUARDED_BY(mu_) = 0;  // lent pieces queued or being written
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_DIRECT_FILE_WRITER_H_
