// Chunk records that two ranged reads of one shard both need, read from the disk once.
//
// OVERVIEW
//   A resharded restore cuts every flat tensor where the new ranks' slices meet, and a cut
//   rarely falls on a chunk boundary: the chunk holding it is needed by the range that ends
//   there and by the one that starts there. The store reads and checks whole chunks, so each
//   such chunk was read from the disk twice (DESIGN.md section 7: resharded read amplification,
//   bytes read / bytes needed, at most 1.1). A shard reader asks this table for the chunks its
//   range starts or ends inside of (edge chunks): the first asker reads the record and
//   Completes it, the others wait for it (OnReady) and decode the same bytes.
//
//   Only the raw record is shared: every reader checks its CRC (and digests) itself, so a reader
//   never hands out a byte it did not check. The table holds records weakly: one is found only
//   while an open reader still holds it (in its read-ahead window, as its current chunk, or
//   as a spare slot it has not reused yet) or a chunk ReadShared lent out does, so it costs no
//   memory of its own, and a read that starts after every reader of a chunk is closed reads
//   the disk (a byte damaged on the disk since is seen). A record whose read failed or whose
//   CRC did not match is Forgotten at once, so a retry reads the disk again. A reader waiting
//   for a record whose read failed (EIO, a short read) fails with that error too, without
//   reading the disk itself: a retry of either reads it again.
//
//   The key names the segment file, the record's offset and length, its payload CRCs and its
//   place in the shard: a checkpoint saved again under the same step (while a reader of the
//   old one still holds a record) is taken for the old one only where all of these agree, and
//   then the reader's own CRC and header checks still stand between it and the bytes.
//
// THREAD SAFETY
//   Thread-safe. OnReady callbacks run on the thread that Completes the record, or at once on
//   the caller's when it is complete already, never under a lock of this table.
#ifndef GRADSNAP_STORAGE_SHARED_RECORDS_H_
#define GRADSNAP_STORAGE_SHARED_RECORDS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "storage/aligned_buffer.h"

namespace gradsnap {
namespace storage {

class SharedRecords {
 public:
  struct Key {
    std::string segment;         // the segment file's path
    uint64_t offset = 0;         // of the record in it
    uint32_t length = 0;         // of the record
    uint32_t crc = 0;            // of its raw payload (ChunkHeader::crc_raw)
    uint32_t crc_stored = 0;     // of its stored payload (ChunkHeader::crc_stored)
    uint64_t stream_offset = 0;  // of its first byte in the shard (ChunkHeader::stream_offset)
    bool operator<(const Key& o) const {
      return std::tie(segment, offset, length, crc, crc_stored, stream_offset) <
             std::tie(o.segment, o.offset, o.length, o.crc, o.crc_stored, o.stream_offset);
    }
  };

  class Record {
   public:
    Record(Key key, std::unique_ptr<AlignedBuffer> buffer, std::shared_ptr<BufferPool> pool)
        : key_(std::move(key)), buffer_(std::move(buffer)), pool_(std::move(pool)) {}
    ~Record();
    Record(const Record&) = delete;
    Record& operator=(const Record&) = delete;

    const Key& key() const { return key_; }
    // Where the first asker reads the record; read-only once Completed.
    AlignedBuffer* buffer() { return buffer_.get(); }
    size_t capacity() const { return buffer_->capacity(); }
    // The first asker's read is over: OK when the record holds key().length bytes.
    void Complete(absl::Status status);
    // Runs fn(status of the read) once the record is complete (at once when it is).
    void OnReady(std::function<void(const absl::Status&)> fn);

   private:
    const Key key_;
    std::unique_ptr<AlignedBuffer> buffer_;
    std::shared_ptr<BufferPool> pool_;  // where buffer_ goes back to, when it is of its size
    absl::Mutex mu_;
    bool ready_ ABSL_GUARDED_BY(mu_) = false;
    absl::Status status_ ABSL_GUARDED_BY(mu_);
    std::vector<std::function<void(const absl::Status&)>> waiters_ ABSL_GUARDED_BY(mu_);
  };

  // enabled = false: Acquire returns null (every reader reads its own records).
  explicit SharedRecords(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // The record for `key`. *first = true: a new one, with a buffer of at least `capacity` bytes
  // (from `pool` when of its size), that the caller must read and Complete. *first = false: one
  // another reader reads or has read, and still holds. nullptr when the table is disabled.
  std::shared_ptr<Record> Acquire(const Key& key, size_t capacity,
                                  const std::shared_ptr<BufferPool>& pool, bool* first);
  // Drops `record` from the table (if it is still there): its read failed or its bytes did not
  // check. Holders keep it; new askers read the disk again.
  void Forget(const Record* record);

  // Records some reader still holds, and how many Acquires found one (for tests).
  size_t live();
  uint64_t hits();

 private:
  const bool enabled_;
  absl::Mutex mu_;
  std::map<Key, std::weak_ptr<Record>> table_ ABSL_GUARDED_BY(mu_);
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_SHARED_RECORDS_H_
