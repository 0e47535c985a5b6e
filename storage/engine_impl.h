// Internal: the Engine implementation, one file per concern: engine_open.cc (Open, the catalog
// guard, the constructor), engine_spec.cc (spec checks), engine_commit.cc (begin, commit and
// abort: the FULL/DELTA rules), engine_write.cc (shard writers), engine_read.cc (catalog
// reads, listing, manifests, readers, verify), engine_gc.cc (delete and GC), epoch.cc (writer
// epochs), recovery.cc, quarantine.cc and rebuild.cc; shard_writer.cc and shard_reader.cc use
// it too.
//
// Layout under data_dir: meta/ (RocksDB) and segments/<job>/<step:20>/r<rank>-<seq>.seg, one
// directory per checkpoint, so deleting a checkpoint unlinks its files (docs/format.md).
//
// THREAD SAFETY: EngineImpl is thread-safe; mu_ serializes every metadata read-modify-write.
// No destructor takes mu_: writers are created and destroyed outside it, and a writer's
// destructor only takes the leaf lock writers_mu_.
#ifndef GRADSNAP_STORAGE_ENGINE_IMPL_H_
#define GRADSNAP_STORAGE_ENGINE_IMPL_H_

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/aligned_buffer.h"
#include "storage/chunk_codec.h"
#include "storage/engine.h"
#include "storage/file_system.h"
#include "storage/metadata.h"
#include "storage/shared_records.h"

namespace gradsnap {
namespace storage {

// "job J step S rank R tensor T" for error messages.
std::string Where(const std::string& job, int64_t step, int32_t rank,
                  const std::string& tensor = "");

class EngineImpl : public Engine {
 public:
  EngineImpl(const EngineOptions& options, FileSystem* fs, std::unique_ptr<MetaStore> meta);
  absl::Status Recover();
  // EngineOptions::prefault_writers and prefault_read_ahead: fills the record pool with
  // faulted-in buffers.
  void PrefaultRecordBuffers();

  absl::Status BeginCheckpoint(const CheckpointSpec& spec) override;
  absl::StatusOr<std::unique_ptr<ShardWriter>> OpenShardWriter(const ShardSpec& spec) override;
  absl::Status WriteShard(const ShardSpec& spec, const std::vector<const void*>& data) override;
  absl::StatusOr<uint64_t> ShardCommittedSize(const std::string& job, int64_t step,
                                              int32_t rank, uint64_t epoch = 0) override;
  absl::Status AbortCheckpoint(const std::string& job, int64_t step,
                               uint64_t epoch = 0) override;
  absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) override;
  absl::StatusOr<uint64_t> RaiseEpoch(const std::string& job, uint64_t to) override;
  absl::StatusOr<std::vector<std::string>> ListJobs() override;
  absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& job,
                                                              bool include_pending) override;
  absl::StatusOr<Manifest> GetManifest(const std::string& job, int64_t step) override;
  absl::StatusOr<std::unique_ptr<ShardReader>> OpenShardReader(const std::string& job,
                                                               int64_t step,
                                                               int32_t rank) override;
  absl::Status Verify(const std::string& job, int64_t step) override;
  WriteSpaceState WriteSpace() override;
  absl::Status Delete(const std::string& job, int64_t step, uint64_t epoch) override;
  absl::Status Quarantine(const std::string& job, int64_t step, const std::string& reason) override;
  absl::StatusOr<GcResult> Gc(const std::string& job, const GcPolicy& policy,
                              uint64_t epoch) override;
  absl::StatusOr<GcResult> GcSteps(const std::string& job, const std::vector<int64_t>& fulls,
                                   uint64_t epoch) override;

  // For writers and readers.
  const EngineOptions& options() const { return options_; }
  // Segment bytes handed to the disk and not yet written, over every writer: the free-space
  // floor (kSegmentFloorBytes) counts them as taken.
  std::atomic<uint64_t>& segment_bytes_in_flight() { return segment_bytes_in_flight_; }
  FileSystem* fs() const { return fs_; }
  MetaStore* meta() const { return meta_.get(); }
  // Record buffers the open shard readers share for read-ahead in buffers the pool does not
  // have on hand (shard_reader.cc); EngineOptions::prefault_read_ahead faults them in at Open.
  static constexpr size_t kReaderFreshBuffers = 32;
  BufferPool* record_pool() { return record_pool_.get(); }
  // The same pool, for buffers that may outlive the engine (chunks ReadShared lent out go back
  // to it when their last holder lets go).
  const std::shared_ptr<BufferPool>& shared_record_pool() { return record_pool_; }
  // Shard readers alive: they share the fresh memory a restore may fault (shard_reader.cc).
  std::atomic<int>* open_readers() { return &open_readers_; }
  // Record buffers for chunks of at most kSmallChunkBytes (small tensors, tensor tails).
  BufferPool* small_record_pool() { return &small_record_pool_; }
  // Records ranged reads of one shard share (EngineOptions::share_edge_records).
  SharedRecords* shared_records() { return &shared_records_; }
  std::string CheckpointDir(const std::string& job, int64_t step) const;
  std::string SegmentPath(const std::string& job, int64_t step, int32_t rank,
                          uint32_t seq) const;
  // Persists a writer's progress in one synced batch: new chunk keys and the shard record; if
  // `finish`, also marks the shard committed and, when it is the last one, the checkpoint.
  absl::Status CommitShardProgress(const ShardRecord& shard,
                                   const std::vector<ChunkRecord>& new_chunks, bool finish);
  void ReleaseWriter(const std::string& shard_key);
  bool HasWriter(const std::string& shard_key);

  absl::StatusOr<CheckpointRecord> LoadCheckpoint(const std::string& job, int64_t step);
  // The DELTAs (any state) whose base is step `full_step` of `job`, in step order.
  absl::StatusOr<std::vector<CheckpointRecord>> DeltasOf(const std::string& job,
                                                         int64_t full_step);
  absl::StatusOr<std::vector<ChunkRecord>> LoadChunks(const std::string& job, int64_t step,
                                                      int32_t rank, uint32_t count);
  // The ShardInfo of a shard record and its chunk records (tensors with their SHA-256s, raw and
  // stored bytes, chunk counts). DATA_LOSS when a chunk names a tensor the shard lacks.
  static absl::StatusOr<ShardInfo> MakeShardInfo(const ShardRecord& rec,
                                                 const std::vector<ChunkRecord>& chunks);

 private:
  // Checks a shard writer may open, records it in active_writers_ and returns its record.
  absl::StatusOr<ShardRecord> ReserveWriterLocked(const ShardSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks a checkpoint whose shards are all committed COMMITTED in `b` (a DELTA only when its
  // base is committed); a FULL also promotes its waiting DELTAs in `b`.
  absl::Status CommitCheckpointLocked(CheckpointRecord* ckpt, MetaStore::Batch* b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION for a read-only engine, and for one whose data directory was removed
  // or replaced since it opened (rm -rf under a running server: writes would land in deleted
  // files and be acknowledged as durable); RESOURCE_EXHAUSTED for one whose catalog opened
  // read-only for want of space (WriteSpaceState::restart_needed). A stat() per mutation.
  absl::Status CheckWritable() const;
  // The checks every change of a job's checkpoints starts with, before taking mu_: a valid
  // job name, then CheckWritable.
  absl::Status CheckJobChange(const std::string& job) const;
  // With mu_ held: the writer's `epoch` is not superseded (CheckJobEpoch), and the record of
  // checkpoint (job, step) to change.
  absl::StatusOr<CheckpointRecord> LoadCheckpointToChangeLocked(const std::string& job,
                                                                int64_t step, uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reader of shard (job, step, rank) whose own record is committed, whether or not its
  // checkpoint is yet (a shard saved again inside a PENDING checkpoint is read back too):
  // NOT_FOUND without a record, FAILED_PRECONDITION for a shard still being written.
  absl::StatusOr<std::unique_ptr<ShardReader>> OpenCommittedShard(const std::string& job,
                                                                  int64_t step, int32_t rank);
  // CheckWritable, then RESOURCE_EXHAUSTED below the catalog's reserve (CheckRoomToAdd): for
  // writes that touch files before their metadata commit (the epoch mirror).
  absl::Status CheckRoomToAdd() const;
  // Reads shard (job, step, rank) whole, checking every chunk's checksums and every tensor's
  // digest (Verify, and the same shard saved again, in a committed or a PENDING checkpoint).
  absl::Status ReadBackShard(const std::string& job, int64_t step, int32_t rank);
  // For a shard saved again over a committed one: DATA_LOSS ("already saved, and what is
  // stored does not read back ... rm") when ReadBackShard finds it damaged, else OK.
  absl::Status SavedShardReadsBack(const std::string& job, int64_t step, int32_t rank);
  // Makes `epoch` the job's epoch: the mirror, then the catalog (synced).
  absl::Status CommitEpochLocked(const std::string& job, uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops from the catalog, and from *checkpoints, each committed DELTA without a committed
  // base FULL, quarantining its directory.
  absl::Status RepairOrphanDeltas(std::vector<CheckpointRecord>* checkpoints);
  // Removes the checkpoint from the catalog, then its files: deleted, or moved to quarantine
  // with `quarantine_reason` when that is not empty.
  absl::Status DeleteLocked(const std::string& job, int64_t step, uint64_t* reclaimed,
                            const std::string& quarantine_reason = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION when a DELTA replays on `ckpt` (its base FULL, or an earlier DELTA of
  // its chain): Delete and Quarantine refuse it.
  absl::Status NothingDependsOnLocked(const CheckpointRecord& ckpt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes (synced) the DELETED marker (storage/rebuild.h) into the checkpoint's directory
  // before its catalog keys are removed: neither a rebuild nor the stale-catalog guard takes a
  // removal stopped after its commit for data to bring back. Best effort: a disk too full for
  // an empty file still deletes (with a warning).
  void MarkDeleted(const std::string& job, int64_t step);
  absl::Status RecoverCheckpoint(const CheckpointRecord& c);
  // Quarantines the checkpoint directories that none of `checkpoints` (the catalog) owns.
  absl::Status RemoveOrphanDirs(const std::vector<CheckpointRecord>& checkpoints);

  // Constant after construction.
  const EngineOptions options_;
  std::atomic<uint64_t> segment_bytes_in_flight_{0};
  // The data directory's identity at open (st_dev, st_ino; 0 when it could not be read).
  uint64_t data_dev_ = 0, data_ino_ = 0;
  FileSystem* const fs_;
  const std::unique_ptr<MetaStore> meta_;
  // Full-size record buffers the pool keeps (EngineOptions::prefault_writers fills at most
  // this many).
  static constexpr size_t kRecordPoolBuffers = 64;
  // Shared: a chunk buffer lent by ReadShared returns to it when its last holder lets go,
  // which may be after the engine is gone.
  const std::shared_ptr<BufferPool> record_pool_;
  BufferPool small_record_pool_;
  std::atomic<int> open_readers_{0};
  SharedRecords shared_records_;

  absl::Mutex mu_;
  // Shard keys with an open writer. A leaf lock (taken after mu_, never before it), so the
  // writer's destructor never needs mu_.
  absl::Mutex writers_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::set<std::string> active_writers_ ABSL_GUARDED_BY(writers_mu_);
};

// Stream offset of each tensor of the shard, then the shard's total (size tensors + 1).
std::vector<uint64_t> TensorStarts(const ShardSpec& spec);

absl::Status ValidateCheckpointSpec(const CheckpointSpec& spec);
absl::Status ValidateShardSpec(const ShardSpec& spec, const CheckpointRecord& ckpt);
bool SameShardSpec(const ShardSpec& a, const ShardSpec& b);

// Reads and decodes one chunk into out[0, raw_len), checking it against its metadata.
// DATA_LOSS names job, step, rank and tensor.
absl::Status ReadChunk(EngineImpl* engine, const std::string& job, int64_t step, int32_t rank,
                       const std::string& tensor, const ChunkRecord& chunk,
                       ChunkDecoder* decoder, uint8_t* out);

// Writer/reader factories (shard_writer.cc, shard_reader.cc).
absl::StatusOr<std::unique_ptr<ShardWriter>> NewShardWriter(EngineImpl* engine,
                                                            ShardRecord record);
absl::StatusOr<std::unique_ptr<ShardReader>> NewShardReader(EngineImpl* engine,
                                                            ShardRecord record);

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_ENGINE_IMPL_H_
