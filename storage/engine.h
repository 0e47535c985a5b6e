// gradsnap storage engine: the public interface (DESIGN.md sections 3 and 5).
//
// OVERVIEW
//   An embeddable, crash-safe checkpoint store. Shard data is cut into chunks (byte-shuffle +
//   zstd + checksums, docs/format.md), appended to segment files through io_uring with O_DIRECT
//   (pwrite fallback), and described in RocksDB. The service (service/) and the client's
//   embedded mode (client/) both sit on this interface; nothing here knows protobuf or gRPC.
//
// DATA MODEL
//   job -> checkpoint(step) -> shard(rank) -> tensor -> chunk. A shard's payload is the
//   concatenation of its tensors' raw bytes in the order of ShardSpec::tensors; writers append
//   that byte stream and may resume it after a crash from `committed_size()`.
//
// COMMIT RULE
//   A shard is committed when all its bytes are durable (data fdatasync'ed, then a synced
//   RocksDB batch). A checkpoint is COMMITTED, listed and restorable, only once all
//   `world_size` shards are committed; the last shard's commit flips the checkpoint's state
//   in the same synced batch. A crash at any instant leaves the whole checkpoint or none of it.
//   A DELTA commits only once its base FULL is committed: a DELTA whose shards are all written
//   while the base is PENDING stays PENDING and is committed in the batch that commits the base.
//   Each shard's segment data ends with a footer (its manifest), so the catalog can be rebuilt
//   from the segments (storage/rebuild.h).
//
// ERRORS
//   INVALID_ARGUMENT bad names/sizes/dtypes; NOT_FOUND unknown job/step/rank; ALREADY_EXISTS a
//   committed checkpoint or shard with a different spec; FAILED_PRECONDITION wrong state (e.g.
//   reading a PENDING checkpoint, deleting a FULL that a kept DELTA needs); DATA_LOSS any checksum
//   or format failure, naming job, step, rank and tensor; RESOURCE_EXHAUSTED out of disk.
//
// THREAD SAFETY
//   Engine is thread-safe. Different shards may be written concurrently from different threads.
//   A ShardWriter or ShardReader is used by one thread at a time and must be destroyed before
//   the Engine. One shard has at most one open writer (a second OpenShardWriter gets
//   UNAVAILABLE until the first is destroyed). One process opens a data_dir at a time (a second
//   Open gets FAILED_PRECONDITION).
#ifndef GRADSNAP_STORAGE_ENGINE_H_
#define GRADSNAP_STORAGE_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/write_space.h"
#include "gradsnap/clock.h"
#include "storage/types.h"

namespace gradsnap {
namespace storage {

struct EngineOptions {
  // Directory holding segments/ and meta/ (RocksDB). Created if missing. Required.
  std::string data_dir;
  // Largest raw chunk. Default: 4 MiB.
  size_t chunk_bytes = 4 << 20;
  // Small tensors (at most 256 KiB) share chunks: consecutive ones are packed into one chunk
  // of at most min(pack_bytes, chunk_bytes) instead of each taking a chunk (and a record
  // padded to 4 KiB) of its own (docs/format.md, "Packed chunks", format 3). Reading one small
  // tensor then reads its whole chunk. 0 disables packing: every chunk holds one tensor's
  // bytes, the format-2 layout. Default: 4 MiB.
  size_t pack_bytes = 4 << 20;
  // zstd level for chunk compression; 0 disables compression. Default: 1.
  int zstd_level = 1;
  // Byte-shuffle float tensors before compressing. Default: true.
  bool shuffle = true;
  // Largest stored/raw size ratio at which a chunk is kept compressed; above it the raw bytes
  // are stored: saving less than 10% is not worth the decode time (fp32 Adam state gains
  // ~5-8%). Default: 0.90.
  double max_compressed_ratio = 0.90;
  // Adaptive compression (docs/format.md, "Compression policy"): try to compress a chunk only
  // while at least three quarters of the writer's in-flight chunks wait for the disk and an
  // encoder is free (at most min(encode_threads, cores - 1) compress at once), and keep it
  // compressed only when its 64 KiB probe predicts a net gain: ratio at most
  // max_compressed_ratio, and the probe's measured encode and decode speeds times the cores
  // that may run them (cores - 1 each) at least the writer's measured disk rate, so neither
  // the write nor the later restore can be slower than with the raw bytes. false: try every
  // chunk on the ratio alone (tests, archival). Default: true.
  bool adapt_compression = true;
  // Use io_uring; false forces the pwrite fallback (tests). Default: true.
  bool use_io_uring = true;
  // Open segment files with O_DIRECT (falls back to buffered I/O where unsupported). Default: true.
  bool use_direct_io = true;
  // io_uring queue depth per segment writer and per shard reader. A shard writer keeps at most
  // J = min(queue_depth, max(16, 2 * encode_threads + 8)) chunks in flight, so its buffers take
  // at most J times 2 * chunk_bytes (128-256 MiB with the defaults); chunks of at most 256 KiB
  // (small tensors) use small buffers, and up to 8 * J of them fit in the same memory. A writer
  // takes J + 1 full-size buffers (at most one per chunk of its shard) when it opens, faulted
  // in then, and holds them until it closes (docs/format.md, "Commit protocol").
  // Default: 32.
  int queue_depth = 32;
  // Roll to a new segment file past this size. Default: 1 GiB.
  uint64_t segment_bytes = 1ull << 30;
  // Threads encoding (shuffle + zstd) and submitting chunks of one writer in parallel; 0 runs
  // that on the appending thread; -1 means one per core (std::thread::hardware_concurrency),
  // at most 16. Default: -1.
  int encode_threads = -1;
  // Per-tensor content digest of newly created shards (docs/format.md, "Digests"): XXH3-128
  // or SHA-256. A shard keeps the algorithm it was created with (a resumed writer too); every
  // read verifies with the algorithm that wrote the shard. Default: XXH3-128.
  DigestAlgo digest = DigestAlgo::kXxh3_128;
  // Filesystem seam for fault injection; nullptr means the real POSIX one. Default: nullptr.
  class FileSystem* fs = nullptr;
  // Open the catalog with RocksDB OpenForReadOnly: nothing under data_dir is created or
  // written (no recovery, no LOCK), so listing, manifests, reads and Verify work on a full or
  // read-only file system and next to a running writer; every mutation is
  // FAILED_PRECONDITION. A data_dir without a catalog is NOT_FOUND. Default: false.
  bool read_only = false;
  // Free space the catalog keeps for itself (docs/format.md, "Full disks"): a metadata commit
  // that adds records is RESOURCE_EXHAUSTED with less free than this (deletes proceed), so
  // RocksDB never meets ENOSPC. A read-write Open of an existing store with less free opens it
  // refusing writes (WriteSpace) until space is back: reads, Delete and Gc work; creating a
  // new store with less is RESOURCE_EXHAUSTED. 0 disables the check. Default: 16 MiB.
  uint64_t catalog_reserve_bytes = 16 << 20;
  // Gc() removes quarantine/ entries older than this many seconds (docs/format.md,
  // "Quarantine"). Default: 604800 (7 days).
  int64_t quarantine_grace_seconds = 7 * 24 * 3600;
  // Shard writers whose full-size record buffers Open allocates and faults in (each writer
  // takes J + 1 when it opens, J as under queue_depth; at most the 64 the engine's pool
  // caches), so that even the first checkpoint after Open copies into mapped pages. Costs
  // that memory, resident, from Open on; 0 leaves the first writes to fault their buffers in.
  // gradsnap-server sets it (--prefault-uploads). Default: 0.
  int prefault_writers = 0;
  // Open also allocates and faults in the record buffers that open shard readers share for
  // read-ahead (32 of them, 128 MiB with the default chunk size; with prefault_writers, at
  // most the pool's 64 in all), so that the first restore after Open reads into mapped pages:
  // a fresh buffer costs zeroing and faulting its pages, measured at a tenth of a server
  // restore's CPU. gradsnap-server sets it (--prefault-read-ahead). Default: false.
  bool prefault_read_ahead = false;
  // Reads of one shard share the records of the chunks their ranges start or end inside of
  // (storage/shared_records.h): such a chunk is read from the disk once for the reads that
  // need it at the same time (the neighbouring slices of a resharded restore; small tensors of
  // one packed chunk read by separate ranged reads); every reader still checks its CRC itself.
  // false: each reader reads its own. Default: true.
  bool share_edge_records = true;
  // Time source (gradsnap/clock.h) of stored timestamps (created/committed/written_unix_ms),
  // quarantine entry names and their ages in Gc; not owned. nullptr: the real clock.
  // Default: nullptr.
  Clock* clock = nullptr;
};

// The most record-buffer memory one ShardWriter of an engine with these options holds: its
// chunks in flight, each with a compressed buffer, plus the chunk being filled.
size_t MaxShardWriterBufferBytes(const EngineOptions& options);
// The full-size record buffers a ShardWriter of an engine with these options takes when it
// opens: one per chunk in flight plus the one being filled (fewer for a shard of fewer chunks).
size_t ShardWriterReservedBuffers(const EngineOptions& options);

using gradsnap::WriteSpaceState;  // common/write_space.h

// Appends one shard's byte stream. Obtained from Engine::OpenShardWriter.
class ShardWriter {
 public:
  virtual ~ShardWriter() = default;
  // Total payload bytes of the shard (sum of tensor byte_length).
  virtual uint64_t total_size() const = 0;
  // Bytes appended so far (the offset of the next Append).
  virtual uint64_t written_size() const = 0;
  // Bytes known durable: a resumed writer starts appending here.
  virtual uint64_t committed_size() const = 0;
  // Appends the next n bytes of the payload. Appending past total_size() is INVALID_ARGUMENT.
  virtual absl::Status Append(const void* data, size_t n) = 0;
  // Makes everything appended so far durable (committed_size() == written_size() after).
  virtual absl::Status Flush() = 0;
  // Requires written_size() == total_size(): flushes, checks expected SHA-256s, commits the
  // shard, and
  // the checkpoint if this was its last shard. Idempotent once it has succeeded.
  virtual absl::Status Finish() = 0;
};

// Reads one committed shard, tensor by tensor or as its payload byte stream.
class ShardReader {
 public:
  virtual ~ShardReader() = default;
  virtual const ShardInfo& info() const = 0;
  // Reads the whole tensor `index` into out[0, byte_length), verifying every chunk and the
  // tensor's digest.
  virtual absl::Status ReadTensor(size_t index, void* out, size_t out_len) = 0;
  // Streams the payload from `offset`: fills up to n bytes, returns the count (0 at the end).
  // Chunks are verified as they are read; the digest of a tensor is checked when the stream
  // passes its end (when the stream started at or before the tensor's start): the call that
  // hands out its last bytes returns DATA_LOSS on a mismatch.
  virtual absl::StatusOr<size_t> Read(uint64_t offset, void* out, size_t n) = 0;
  // Read without the copy: points *data at up to n payload bytes from `offset` inside the
  // reader's decoded chunk (at most to the chunk's end) and returns their count (0 at the end),
  // verified as Read verifies them. *data stays valid until the next call on this reader.
  virtual absl::StatusOr<size_t> ReadView(uint64_t offset, size_t n, const uint8_t** data) = 0;
  // ReadView whose bytes outlive the next call: *hold owns the decoded chunk's memory, which the
  // reader does not reuse until every copy of *hold is dropped (on any thread, also after the
  // reader is destroyed). For lending the bytes to a transport (gRPC slices) without a copy.
  virtual absl::StatusOr<size_t> ReadShared(uint64_t offset, size_t n, const uint8_t** data,
                                            std::shared_ptr<const void>* hold) = 0;
  // A ranged reader: no Read will go past payload byte `end`, so read-ahead stops at the chunk
  // holding it instead of fetching up to 128 MiB the caller will not ask for. Default: none.
  virtual void SetReadEnd(uint64_t end) { (void)end; }
};

class Engine {
 public:
  // Opens (creating if needed) and recovers (docs/format.md, "Recovery"): PENDING checkpoints
  // stay resumable (never listed; AbortCheckpoint rolls one back), segment bytes past the last
  // durable offset are truncated, unreferenced segment files and directories are moved to
  // quarantine/ (never unlinked). When the catalog (meta/) is missing, empty or unreadable
  // while segments/ holds data, or older than the data (segments/ holds a whole checkpoint it
  // does not know above its newest step of that job: CheckCatalogNotStale), Open refuses with
  // FAILED_PRECONDITION naming --rebuild-catalog and changes nothing on disk.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options);
  virtual ~Engine() = default;

  // Starts a checkpoint (state PENDING). Idempotent for an identical spec, also once it is
  // committed (a restarted attempt re-persisting a step); ALREADY_EXISTS if a checkpoint with
  // this (job, step) exists with a different spec.
  virtual absl::Status BeginCheckpoint(const CheckpointSpec& spec) = 0;
  // Opens a writer for one shard of a begun checkpoint. If the same shard was partly written
  // before (same spec), the writer resumes at its committed_size(); if it is already
  // committed (same spec), the writer is finished: committed_size() == total_size() and
  // Finish() returns OK. A different spec for a shard with durable bytes: ALREADY_EXISTS.
  virtual absl::StatusOr<std::unique_ptr<ShardWriter>> OpenShardWriter(const ShardSpec& spec) = 0;
  // Convenience: writes a whole shard from memory. data[i] holds tensors[i]'s bytes.
  virtual absl::Status WriteShard(const ShardSpec& spec,
                                  const std::vector<const void*>& data) = 0;
  // Durable bytes of a partly written shard (0 if never started), as in ByteStream's
  // QueryWriteStatus. For a writer of `epoch`: 0 where those bytes are an older attempt's
  // (its writer starts the shard over: ShardRecord::epoch). For a committed shard (a save
  // again, which then sends nothing) the stored shard is read back first: DATA_LOSS ("already
  // saved, and what is stored does not read back ... rm") when damaged, so a damaged copy is
  // never counted saved; OpenShardWriter applies the same rule.
  virtual absl::StatusOr<uint64_t> ShardCommittedSize(const std::string& job, int64_t step,
                                                      int32_t rank, uint64_t epoch = 0) = 0;
  // Takes the next writer epoch of `job` (storage/epoch.h): every later request of the job
  // carrying an older non-zero epoch is refused with FAILED_PRECONDITION "superseded by attempt
  // N". Durable before it returns.
  virtual absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) = 0;
  // Takes no new epoch: raises `job`'s epoch to `to` where it is below (durable before it
  // returns) and answers the job's epoch, `to` or above. So a node that handed out fewer epochs
  // than another (down during an acquisition, added later) fences the same older attempts.
  virtual absl::StatusOr<uint64_t> RaiseEpoch(const std::string& job, uint64_t to) = 0;
  // Abandons a PENDING checkpoint and frees its space. A PENDING FULL takes its PENDING DELTAs
  // with it; one with a committed DELTA (written by an older version) is FAILED_PRECONDITION.
  // A non-zero `epoch` older than the job's newest is FAILED_PRECONDITION "superseded" (a
  // zombie's rollback never aborts the new attempt's checkpoint).
  virtual absl::Status AbortCheckpoint(const std::string& job, int64_t step,
                                       uint64_t epoch = 0) = 0;

  virtual absl::StatusOr<std::vector<std::string>> ListJobs() = 0;
  // Checkpoints of a job by step; committed ones only unless include_pending.
  virtual absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(
      const std::string& job, bool include_pending = false) = 0;
  virtual absl::StatusOr<Manifest> GetManifest(const std::string& job, int64_t step) = 0;
  virtual absl::StatusOr<std::unique_ptr<ShardReader>> OpenShardReader(const std::string& job,
                                                                       int64_t step,
                                                                       int32_t rank) = 0;
  // Re-reads every chunk of every shard and checks checksums and digests.
  virtual absl::Status Verify(const std::string& job, int64_t step) = 0;
  // Whether writes are refused for want of space, from the free space now (a statvfs): a
  // node below its catalog's reserve takes writes again as soon as space is back. (A read-only
  // engine reports what a read-write open would meet.)
  virtual WriteSpaceState WriteSpace() = 0;
  // Deletes a checkpoint. FAILED_PRECONDITION if a remaining DELTA depends on it. A non-zero
  // `epoch` older than the job's newest is FAILED_PRECONDITION "superseded" (as for
  // AbortCheckpoint: a zombie of an older attempt deletes nothing); 0 is unfenced (the CLI).
  virtual absl::Status Delete(const std::string& job, int64_t step, uint64_t epoch = 0) = 0;
  // Takes a COMMITTED checkpoint out of the catalog and moves its files to quarantine/ (never
  // deleted: docs/format.md, "Quarantine"), logging `reason`: cluster mode's copies that no
  // etcd record names. FAILED_PRECONDITION for a PENDING one or one a DELTA depends on;
  // ABORTED while a shard of it is being written.
  virtual absl::Status Quarantine(const std::string& job, int64_t step,
                                  const std::string& reason) = 0;
  // Retention: deletes FULLs outside the policy (with their DELTAs) and reclaims segment space;
  // also empties quarantine entries older than quarantine_grace_seconds. keep_last counts only
  // FULLs that verify (each kept FULL is read back whole, newest first, until keep_last pass): a
  // damaged one is kept but not counted, and with fewer good FULLs than keep_last nothing is
  // deleted, so the checkpoint a restore of `latest` falls back to is never the one deleted.
  // `epoch` as for Delete.
  virtual absl::StatusOr<GcResult> Gc(const std::string& job, const GcPolicy& policy,
                                      uint64_t epoch = 0) = 0;
  // Gc's deletions with the choice made elsewhere (common/gc_plan.h: the remote client's, over
  // every node): deletes each of `fulls` this engine holds COMMITTED, with all its DELTAs, and
  // empties quarantine as Gc does. A step not held committed here is skipped; a step that is a
  // DELTA here is INVALID_ARGUMENT, and nothing is deleted.
  virtual absl::StatusOr<GcResult> GcSteps(const std::string& job,
                                           const std::vector<int64_t>& fulls,
                                           uint64_t epoch = 0) = 0;
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_ENGINE_H_
