// The shard footer: each committed shard's manifest, stored after its segment data so the
// catalog can be rebuilt from the segments alone (docs/format.md, "Shard footer").
//
// A footer is the last record of the shard's last segment file, written and fdatasync'ed
// before the metadata batch that commits the shard. It starts on a 4 KiB boundary and fills
// whole 4 KiB blocks: payload, zero padding, then a 32-byte trailer that ends the file:
//
//   trailer: magic u64 "GSFOOTR1", payload_len u64, written_unix_ms i64,
//            crc32c(payload) u32, crc32c(trailer bytes 0..27) u32
//   payload: version u8 (2), CheckpointRecord str, ShardRecord str (committed, segments with
//            their durable_end, the footer's own segment included, the writer's epoch),
//            job epoch u64 (version 2), chunk count u32, then one ChunkRecord str per chunk
//            in index order (str = u32 length + bytes; the records are encoded as in
//            RocksDB, metadata.h). Version 1 has no job epoch (read as 0).
//
// THREAD SAFETY: free functions.
#ifndef GRADSNAP_STORAGE_FOOTER_H_
#define GRADSNAP_STORAGE_FOOTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/file_system.h"
#include "storage/metadata.h"

namespace gradsnap {
namespace storage {

constexpr uint64_t kFooterMagic = 0x3152544f4f465347ull;  // "GSFOOTR1" little-endian
constexpr size_t kFooterTrailerSize = 32;

struct ShardFooter {
  CheckpointRecord checkpoint;  // spec and created_unix_ms (state as of the write)
  ShardRecord shard;            // as committed
  std::vector<ChunkRecord> chunks;
  int64_t written_unix_ms = 0;
  // The job's writer epoch (storage/epoch.h) when the footer was written: at least
  // shard.epoch, the epoch of the shard's own writer (a writer already superseded writes no
  // footer). 0 in version-1 footers and where no epoch was ever taken.
  uint64_t job_epoch = 0;
};

// The footer's bytes, a multiple of 4 KiB (payload, padding, trailer).
std::string EncodeFooter(const ShardFooter& f);
// Bytes EncodeFooter will produce for `f` (independent of the durable_end values).
size_t FooterSize(const ShardFooter& f);

// Reads the footer that ends the file at `path`. NOT_FOUND when the file does not end with a
// footer (a segment that is not a shard's last, or one cut short); DATA_LOSS when the trailer
// is intact but the payload is not.
absl::StatusOr<ShardFooter> ReadFooter(FileSystem* fs, const std::string& path);

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_FOOTER_H_
