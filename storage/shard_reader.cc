// ShardReaderImpl: reads a committed shard chunk by chunk.
//
// OVERVIEW
//   Chunks are read with O_DIRECT reads (every record starts on a 4 KiB boundary; see I/O below)
//   and decoded on a pool of threads, up to 128 MiB of chunks ahead of the consumer,
//   so several reads are in flight while the caller copies and hashes in order (one pass: each
//   cache-sized block is hashed right after it is copied out). Every chunk is checked against
//   its metadata and both CRCs; every tensor's digest (with the algorithm that wrote the shard)
//   is checked before the call that hands out the tensor's last bytes returns. Chunks are
//   located by stream offset, so a packed chunk (several small tensors, format 3) is read
//   once and each tensor copied out of it; the last chunk taken stays decoded (cur_) for the
//   next tensor that lies in it.
//
// ERROR HANDLING
//   Any failure is DATA_LOSS naming job, step, rank and tensor; no byte of a failed chunk is
//   returned.
//
// THREAD SAFETY
//   One caller thread at a time; pool threads only touch their own slot.
//
// I/O
//   With io_uring (UringReader) every chunk of the window is in flight at once, up to
//   EngineOptions::queue_depth, read into registered slot buffers from registered segment
//   files; each completion hands its record to the decode pool (one thread per core: CRC
//   checks, decompression), so the disk never waits for the CPU. A reader used without a
//   destination (ReadView, ReadShared: the server lends the bytes to gRPC, no copy here)
//   leaves a raw chunk's payload CRC to the caller's thread, which checks it when it takes the
//   chunk, before handing out any of its bytes, in one pass with the tensor digests
//   (VerifyHeld: each 96 KiB block hashed from the cache right after its CRC), so a server's
//   restore reads the bytes from memory once there instead of twice. A short read is
//   resubmitted for the rest; an I/O error (EIO) fails the chunk like corruption. Without io_uring
//   (disabled, or a File without a descriptor) the pool threads (up to 16) pread, then decode.
//   Slot buffers of full records come from the engine's record pool and go back to it when their
//   slot dies: with the reader, or for a chunk ReadShared lent out, when its last holder lets go
//   (the pool outlives the engine while a holder needs it). So restores reuse memory the writers
//   and earlier restores already faulted: a fresh 4 MiB buffer costs zeroing and faulting its
//   pages, which for a server restore was about half its CPU. The engine's open readers share
//   kFreshBuffers fresh buffers (kMinWindow to kMaxFresh each); past its share a reader reads ahead
//   only into buffers the pool has on hand. So concurrent readers (one per Read stream in a
//   server) do not each fault up to kReadAheadBytes of new memory, and what they fault fits
//   back into the pool for the next restore.
#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/digest.h"
#include "common/logging.h"
#include "common/populate.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/shared_records.h"
#include "storage/storage_stats.h"
#include "storage/task_pool.h"
#include "storage/uring_reader.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr size_t kReadAheadBytes = 128 << 20;  // per reader: bounds its memory
constexpr size_t kMaxWindow = 64;                // chunks read ahead, at most
constexpr size_t kMinWindow = 2;     // chunks a reader reads ahead whatever the pool holds
constexpr size_t kMaxFresh = 8;      // chunks a reader reads ahead into fresh buffers, at most
constexpr size_t kFreshBuffers = EngineImpl::kReaderFreshBuffers;  // shared by open readers
constexpr int kMaxReaderThreads = 16;            // concurrent positional reads (O_DIRECT)
constexpr size_t kFuseBlock = 64 << 10;          // copied then hashed while in cache
constexpr size_t kVerifyBlock = 96 << 10;        // VerifyHeld: CRC'd (3 x 32 KiB) then hashed
constexpr uint64_t kNoHash = UINT64_MAX;         // Hold: not a streaming read

absl::StatusOr<std::unique_ptr<File>> OpenSegment(EngineImpl* engine, const std::string& job,
                                                  int64_t step, int32_t rank, uint32_t seq) {
  OpenOptions oo;
  oo.direct = engine->options().use_direct_io;
  return engine->fs()->Open(engine->SegmentPath(job, step, rank, seq), oo);
}

void LogPreadOnce(const std::string& why) {
  static std::once_flag once;
  std::call_once(once,
                 [&] { GS_LOG(WARNING) << "storage: reading with pread, not io_uring: " << why; });
}

// The failure `s` of reading a tensor's data, prefixed with `where`. DATA_LOSS where the data is
// gone or wrong (a checksum, digest or length, a missing segment, EIO); a refusal of the machine
// (EMFILE, ENOMEM, EPERM, a refused io_uring) keeps its code: the checkpoint is fine, and a
// restore must not take it for a damaged one and fall back to an older step.
absl::Status ReadFailure(const std::string& where, const absl::Status& s) {
  const bool lost = absl::IsDataLoss(s) || absl::IsNotFound(s);
  if (lost) StorageStats::Get().data_loss->Add();
  return absl::Status(lost ? absl::StatusCode::kDataLoss : s.code(),
                      absl::StrCat(where, ": ", s.message()));
}

// DATA_LOSS unless `got` bytes hold the whole record of `c`.
absl::Status CheckLength(const ChunkRecord& c, size_t got) {
  if (got >= c.header.record_len()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("segment truncated: chunk at offset ", c.offset,
                                          " needs ", c.header.record_len(), " bytes, found ",
                                          got));
}

absl::Status ReadRecord(File* file, const ChunkRecord& c, AlignedBuffer* buf) {
  size_t len = AlignUp(c.header.record_len());
  if (buf->capacity() < len) *buf = AlignedBuffer(len);
  ASSIGN_OR_RETURN(size_t got, file->Read(c.offset, buf->data(), len));
  return CheckLength(c, got);
}

struct ReaderContext {
  ChunkDecoder decoder;
};

// One chunk read ahead. Buffers are reused across chunks (no fresh page faults).
struct Slot {
  ~Slot() {
    if (pool != nullptr) pool->Put(std::move(record));  // other sizes: dropped
  }
  int index = 0;                  // its fixed-buffer slot in the ring
  size_t chunk = 0;
  std::shared_ptr<BufferPool> pool;       // where `record` goes when the slot dies
  std::unique_ptr<AlignedBuffer> record;  // the record as read (O_DIRECT)
  bool new_record = false;        // `record` is not registered with the ring yet
  std::vector<uint8_t> decoded;   // decompressed bytes, for zstd records
  const uint8_t* data = nullptr;  // the chunk's raw bytes: into record or decoded
  size_t size = 0;
  absl::Status status;
  bool done = false;
  bool crc_pending = false;  // a raw record whose payload CRC the caller checks (VerifyHeld)
  bool prehashed = false;    // VerifyHeld fed its bytes to the stream's digest
  // An edge chunk's record, shared with the other reads that need it (shared_records.h): read
  // into its buffer (by this reader or another), not into `record`.
  std::shared_ptr<SharedRecords::Record> shared;
  uint8_t* record_data() { return shared != nullptr ? shared->buffer()->data() : record->data(); }
};

class ShardReaderImpl : public ShardReader {
 public:
  ShardReaderImpl(EngineImpl* engine, ShardInfo info, std::vector<ChunkRecord> chunks,
                  std::string job, int64_t step)
      : engine_(engine), info_(std::move(info)), chunks_(std::move(chunks)),
        job_(std::move(job)), step_(step), digest_(info_.digest_algo) {
    uint64_t pos = 0;
    for (const TensorInfo& t : info_.tensors) {
      tensor_start_.push_back(pos);
      pos += t.spec.byte_length;
    }
    tensor_start_.push_back(pos);
    const std::string empty_digest = DigestHex(info_.digest_algo, nullptr, 0);
    for (size_t t = 0; t < info_.tensors.size(); ++t) {
      if (info_.tensors[t].spec.byte_length == 0 && info_.tensors[t].digest != empty_digest) {
        bad_tensors_.insert(static_cast<uint32_t>(t));
      }
    }
    for (const ChunkRecord& c : chunks_) {
      max_raw_len_ = std::max<size_t>(max_raw_len_, c.header.raw_len);
    }
    // The shard's own chunk size, not this engine's (a shard written with 64 MiB chunks read by
    // an engine of 4 MiB ones would read 2 GiB ahead): the window holds kReadAheadBytes.
    window_limit_ = std::clamp<size_t>(
        kReadAheadBytes / std::max<size_t>(max_raw_len_, 4096), kMinWindow, kMaxWindow);
    engine->open_readers()->fetch_add(1);
  }
  // Slots only this reader holds die with it (their buffers go back to the pool); lent ones
  // live on with their holders.
  ~ShardReaderImpl() override {
    Cancel();
    engine_->open_readers()->fetch_sub(1);
  }

  absl::Status Open() {
    std::vector<File*> files;
    std::vector<std::string> names;
    for (const ChunkRecord& c : chunks_) {
      if (files_.count(c.segment) != 0) continue;
      auto f = OpenSegment(engine_, job_, step_, info_.rank, c.segment);
      if (!f.ok()) return Loss(c.tensor, f.status());
      file_index_[c.segment] = static_cast<int>(files.size());
      files.push_back(f->get());
      names.push_back(absl::StrCat("segment ", c.segment));
      files_[c.segment] = std::move(*f);
    }
    StartRing(std::move(files), std::move(names));
    // With the ring the pool only decodes: one thread per core. Without it, its threads also
    // wait in pread, so more of them keep several reads in flight.
    int threads = ring_ != nullptr
                      ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                      : kMaxReaderThreads;
    pool_ = std::make_unique<TaskPool<ReaderContext>>(
        std::min<int>(threads, static_cast<int>(window_limit_)),
        [] { return std::make_unique<ReaderContext>(); });
    return absl::OkStatus();
  }

  const ShardInfo& info() const override { return info_; }
  absl::Status ReadTensor(size_t index, void* out, size_t out_len) override;
  absl::StatusOr<size_t> Read(uint64_t offset, void* out, size_t n) override;
  absl::StatusOr<size_t> ReadView(uint64_t offset, size_t n, const uint8_t** data) override;
  absl::StatusOr<size_t> ReadShared(uint64_t offset, size_t n, const uint8_t** data,
                                    std::shared_ptr<const void>* hold) override;
  void SetReadEnd(uint64_t end) override { read_end_ = end; }

 private:
  absl::Status Loss(uint32_t tensor, const absl::Status& s) const {
    std::string name = tensor < info_.tensors.size() ? info_.tensors[tensor].spec.name : "";
    return ReadFailure(Where(job_, step_, info_.rank, name), s);
  }
  // A failed packed chunk loses every tensor in it (one CRC covers them all): the error
  // names them (the first kMaxNamed).
  absl::Status PackedLoss(const ChunkRecord& c, const absl::Status& s) const {
    if (c.members.empty()) return s;
    constexpr size_t kMaxNamed = 8;
    std::string names;
    for (size_t i = 0; i < c.members.size() && i < kMaxNamed; ++i) {
      const uint32_t t = c.members[i].tensor;
      absl::StrAppend(&names, i == 0 ? "" : ", ",
                      t < info_.tensors.size() ? info_.tensors[t].spec.name : "?");
    }
    if (c.members.size() > kMaxNamed) {
      absl::StrAppend(&names, " and ", c.members.size() - kMaxNamed, " more");
    }
    return absl::Status(s.code(),
                        absl::StrCat("packed chunk holding tensors ", names, ": ", s.message()));
  }
  // Tensor `t`'s digest came out wrong in a streaming read: DATA_LOSS, now and for any later
  // read of this reader that touches it (bad_tensors_).
  absl::Status DigestFailed(uint32_t t) {
    bad_tensors_.insert(t);
    return Loss(t, DigestMismatch());
  }
  absl::Status DigestMismatch() const {
    return absl::DataLossError(
        absl::StrCat("tensor ", DigestAlgoName(info_.digest_algo), " digest mismatch"));
  }
  // The chunk holding stream byte `offset`; chunks_.size() when none does.
  size_t ChunkAt(uint64_t offset) const;
  // The tensor holding stream byte `offset` (< the total).
  uint32_t TensorAt(uint64_t offset) const;
  // DATA_LOSS when [from, to) of the stream touches a tensor in bad_tensors_.
  absl::Status CheckKnownBad(uint64_t from, uint64_t to);
  // Starts reading `chunk` into a spare slot or a new one; false (nothing started) when a new
  // one would need a fresh buffer and `must` is not set.
  bool Schedule(size_t chunk, bool must);
  // Whether this read starts or ends inside `c`: its record may be another read's too.
  bool IsEdge(const ChunkRecord& c) const;
  // The shared record for edge chunk `c` (SharedRecords::Acquire), or null.
  std::shared_ptr<SharedRecords::Record> ShareEdge(const ChunkRecord& c, size_t len, bool* first);
  void CompleteShared(Slot* slot, const absl::Status& s);
  // Makes cur_ the decoded chunk `chunk` (kept when it already is); errors name `tensor`.
  // `hash_from`: where a streaming read (Read, ReadView) enters the chunk; a chunk checked
  // here (VerifyHeld) feeds the stream's digests from there. kNoHash for ReadTensor, which
  // hashes on its own.
  absl::Status Hold(size_t chunk, uint32_t tensor, uint64_t hash_from);
  // Checks cur_'s deferred CRC and hashes its bytes from `hash_from` in the same pass.
  absl::Status VerifyHeld(uint32_t tensor, uint64_t hash_from);
  // Feeds stream bytes [from, to) of cur_ to the digest (HashRun, tensor by tensor).
  void HashHeld(uint64_t from, uint64_t to, int64_t* mismatch);
  // The stream digest's one rule, for CopyOut and VerifyHeld alike: bytes [from, from + n) of
  // tensor `t` (at p) begin its digest when `from` is the tensor's start, extend it when they
  // continue where it stopped, and otherwise stop hashing until the next tensor start (the
  // stream started mid-tensor or jumped: CRCs only). The run that reaches the tensor's end
  // checks the digest; a mismatch puts `t` in *mismatch (the first one is kept).
  void HashRun(uint32_t t, uint64_t from, const uint8_t* p, size_t n, int64_t* mismatch);
  absl::Status Take(size_t chunk, uint32_t tensor, std::shared_ptr<Slot>* slot);
  void Recycle(std::shared_ptr<Slot> slot);
  void Reclaim();
  // The record buffer size for records of `len` bytes, and whether it comes from the pool.
  size_t RecordCapacity(size_t len) const;
  bool Pooled(size_t capacity) const;
  // Gives the slot a record buffer of at least `len` bytes (new_record when it is a new one).
  void SizeRecord(Slot* slot, size_t len);
  void StartRing(std::vector<File*> files, std::vector<std::string> names);
  void ReadWithRing(const std::shared_ptr<Slot>& slot, bool fill_shared);
  void Decode(const std::shared_ptr<Slot>& slot, ReaderContext* ctx);
  void Finish(const std::shared_ptr<Slot>& slot, const absl::Status& s);
  void Cancel();
  absl::Status CopyOut(uint32_t tensor, const uint8_t* src, uint64_t offset, uint8_t* dst,
                       size_t n);

  EngineImpl* const engine_;
  const ShardInfo info_;
  const std::vector<ChunkRecord> chunks_;  // in stream order
  const std::string job_;
  const int64_t step_;
  std::vector<uint64_t> tensor_start_;     // plus the total at the end
  std::map<uint32_t, std::unique_ptr<File>> files_;

  size_t window_limit_ = 4;
  size_t max_raw_len_ = 0;  // of the shard's chunks: bounds every record (compressed ones too)
  uint64_t read_end_ = UINT64_MAX;  // SetReadEnd: no read-ahead of chunks starting past it
  uint64_t read_start_ = UINT64_MAX;  // where the first Read started (UINT64_MAX: none yet)
  std::deque<std::shared_ptr<Slot>> window_;  // scheduled, in order
  absl::Mutex mu_;
  // Streaming state.
  std::shared_ptr<Slot> cur_;
  std::vector<std::shared_ptr<Slot>> spare_;  // finished slots whose buffers are reused
  // Slots whose bytes ReadShared lent out: reused once only this list holds them.
  std::vector<std::shared_ptr<Slot>> lent_;
  int64_t hash_tensor_ = -1;
  uint64_t hash_next_ = 0;
  Digester digest_;
  // Tensors known bad: a digest this reader found wrong (a retry at an offset inside the
  // tensor would not see its start and hash it again), and empty tensors whose recorded digest
  // is not the empty input's (a stream passes them without a byte to hash). A read that
  // touches or passes one fails again.
  std::set<uint32_t> bad_tensors_;
  std::atomic<bool> defer_crc_{false};  // set by ReadView, read by the decode pool
  std::map<uint32_t, int> file_index_;  // segment -> its index in the ring
  int slots_made_ = 0;
  std::unique_ptr<TaskPool<ReaderContext>> pool_;
  // Declared after pool_: destroyed first, so no ring callback runs into a dead pool.
  std::unique_ptr<UringReader> ring_;
};

void ShardReaderImpl::StartRing(std::vector<File*> files, std::vector<std::string> names) {
  const EngineOptions& o = engine_->options();
  if (!o.use_io_uring) return LogPreadOnce("disabled by options");
  // One buffer per slot: the window plus the one the caller holds.
  auto ring = UringReader::Create(std::move(files), std::move(names), o.queue_depth,
                                  static_cast<int>(window_limit_ + 1));
  if (!ring.ok()) return LogPreadOnce(std::string(ring.status().message()));
  ring_ = std::move(*ring);
}

bool ShardReaderImpl::Schedule(size_t chunk, bool must) {
  const size_t len = AlignUp(chunks_[chunk].header.record_len());
  // An edge chunk is read into its shared record, not a slot buffer: a new slot for it takes
  // none (and so no fresh memory of the readers' share).
  const bool edge = IsEdge(chunks_[chunk]) && engine_->shared_records()->enabled();
  std::shared_ptr<Slot> slot;
  if (!spare_.empty()) {
    slot = std::move(spare_.back());
    spare_.pop_back();
  } else {
    std::unique_ptr<AlignedBuffer> pooled;
    const size_t want = RecordCapacity(len);
    const size_t readers = static_cast<size_t>(std::max(1, engine_->open_readers()->load()));
    const size_t share = std::clamp(kFreshBuffers / readers, kMinWindow, kMaxFresh);
    const bool fresh_ok =
        edge || must || window_.size() + lent_.size() < share || !Pooled(want);
    if (!fresh_ok && (pooled = engine_->record_pool()->TryGet()) == nullptr) return false;
    slot = std::make_shared<Slot>();
    slot->index = slots_made_++;
    slot->pool = engine_->shared_record_pool();
    slot->new_record = pooled != nullptr;
    slot->record = std::move(pooled);
  }
  bool first = true;
  slot->shared = edge ? ShareEdge(chunks_[chunk], len, &first) : nullptr;
  // In the caller's thread: which buffer a chunk gets does not depend on the pool's timing.
  if (slot->shared == nullptr) SizeRecord(slot.get(), len);
  slot->chunk = chunk;
  slot->done = false;
  slot->crc_pending = slot->prehashed = false;
  slot->status = absl::OkStatus();
  window_.push_back(slot);
  if (!first) {  // another reader reads (or has read) the record: decode it once it is in
    slot->shared->OnReady([this, slot](const absl::Status& s) {
      if (!s.ok()) return Finish(slot, s);
      pool_->Run([this, slot](ReaderContext* ctx) { Decode(slot, ctx); });
    });
    return true;
  }
  if (ring_ != nullptr) {
    ReadWithRing(slot, slot->shared != nullptr);
    return true;
  }
  pool_->Run([this, slot](ReaderContext* ctx) {
    const ChunkRecord& c = chunks_[slot->chunk];
    AlignedBuffer* buf = slot->shared != nullptr ? slot->shared->buffer() : slot->record.get();
    absl::Status s = ReadRecord(files_.at(c.segment).get(), c, buf);
    if (slot->shared != nullptr) CompleteShared(slot.get(), s);
    if (!s.ok()) return Finish(slot, s);
    Decode(slot, ctx);
  });
  return true;
}

bool ShardReaderImpl::IsEdge(const ChunkRecord& c) const {
  return read_start_ != UINT64_MAX &&
         (c.header.stream_offset < read_start_ ||
          c.header.stream_offset + c.header.raw_len > read_end_);
}

std::shared_ptr<SharedRecords::Record> ShardReaderImpl::ShareEdge(const ChunkRecord& c,
                                                                  size_t len, bool* first) {
  SharedRecords::Key key{engine_->SegmentPath(job_, step_, info_.rank, c.segment),
                         c.offset,
                         static_cast<uint32_t>(c.header.record_len()),
                         c.header.crc_raw,
                         c.header.crc_stored,
                         c.header.stream_offset};
  return engine_->shared_records()->Acquire(key, len, engine_->shared_record_pool(), first);
}

// The read of a shared record this reader made is over: the other readers waiting for it go
// on; a failed one is not shared again.
void ShardReaderImpl::CompleteShared(Slot* slot, const absl::Status& s) {
  if (!s.ok()) engine_->shared_records()->Forget(slot->shared.get());
  slot->shared->Complete(s);
}

// The record goes out on the ring; its completion queues the decode on the pool. With
// `fill_shared`, into the slot's shared record (not registered: it is not the slot's buffer),
// which the completion hands to the readers waiting for it.
void ShardReaderImpl::ReadWithRing(const std::shared_ptr<Slot>& slot, bool fill_shared) {
  const ChunkRecord& c = chunks_[slot->chunk];
  size_t len = AlignUp(c.header.record_len());
  int fixed = -1;
  if (!fill_shared) {
    fixed = slot->index;
    if (slot->new_record &&
        !ring_->RegisterBuffer(slot->index, slot->record->data(), slot->record->capacity())) {
      fixed = -1;
    }
    slot->new_record = false;
  }
  ring_->Read(file_index_.at(c.segment), c.offset, slot->record_data(), len, fixed,
              [this, slot, fill_shared](absl::StatusOr<size_t> got) {
                absl::Status s =
                    got.ok() ? CheckLength(chunks_[slot->chunk], *got) : got.status();
                if (fill_shared) CompleteShared(slot.get(), s);
                if (!s.ok()) return Finish(slot, s);
                pool_->Run([this, slot](ReaderContext* ctx) { Decode(slot, ctx); });
              });
}

void ShardReaderImpl::Decode(const std::shared_ptr<Slot>& slot, ReaderContext* ctx) {
  const ChunkRecord& c = chunks_[slot->chunk];
  const bool defer = defer_crc_.load(std::memory_order_relaxed);
  absl::Status s = ctx->decoder.DecodeView(slot->record_data(), c.header.record_len(), &c.header,
                                           &slot->decoded, &slot->data,
                                           defer ? &slot->crc_pending : nullptr);
  slot->size = c.header.raw_len;
  // Bytes that do not check are not shared again: a retry reads the disk.
  if (!s.ok() && slot->shared != nullptr) engine_->shared_records()->Forget(slot->shared.get());
  Finish(slot, s);
}

void ShardReaderImpl::Finish(const std::shared_ptr<Slot>& slot, const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  slot->status = s;
  slot->done = true;
}

// Returns the decoded chunk `chunk`, keeping up to window_limit_ later chunks in flight.
void ShardReaderImpl::Recycle(std::shared_ptr<Slot> slot) {
  if (slot == nullptr) return;
  // A slot lent by ReadShared is still being read elsewhere: its buffers wait in lent_.
  (slot.use_count() > 1 ? lent_ : spare_).push_back(std::move(slot));
}

// Moves the lent slots nobody else holds any more to spare_. A count of 1 cannot rise again
// (only lent_ holds the slot); the fence orders the borrower's last reads before our reuse.
void ShardReaderImpl::Reclaim() {
  for (size_t i = 0; i < lent_.size();) {
    if (lent_[i].use_count() > 1) {
      ++i;
      continue;
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    spare_.push_back(std::move(lent_[i]));
    lent_[i] = std::move(lent_.back());
    lent_.pop_back();
  }
}

// Sized for the largest record of the shard at once: a slot that first held a small (compressed
// or packed) record is not reallocated and registered again for a larger one. Buffers of about
// the engine's full record size come from its record pool, which the writers fill and every
// slot gives back when it dies (~Slot): a restore reuses pages already faulted instead of
// faulting up to kReadAheadBytes of fresh memory per reader (on this project's VM that cost
// 0.6 CPU-s for a 256 MiB restore, more than the reading itself).
size_t ShardReaderImpl::RecordCapacity(size_t len) const {
  return std::max(len, AlignUp(kChunkHeaderSize + max_raw_len_));
}

// A shard of small records keeps small buffers: a pool buffer would pin memory it never uses.
bool ShardReaderImpl::Pooled(size_t capacity) const {
  const size_t pool = engine_->record_pool()->buffer_capacity();
  return capacity <= pool && capacity > pool / 2;
}

void ShardReaderImpl::SizeRecord(Slot* slot, size_t len) {
  if (slot->record != nullptr && slot->record->capacity() >= len) return;
  const size_t want = RecordCapacity(len);
  BufferPool* pool = engine_->record_pool();
  if (slot->record != nullptr) pool->Put(std::move(slot->record));
  slot->record = Pooled(want) ? pool->Get() : std::make_unique<AlignedBuffer>(want);
  slot->new_record = true;
}

size_t ShardReaderImpl::ChunkAt(uint64_t offset) const {
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), offset,
                             [](uint64_t off, const ChunkRecord& c) {
                               return off < c.header.stream_offset;
                             });
  if (it == chunks_.begin()) return chunks_.size();
  --it;
  if (offset >= it->header.stream_offset + it->header.raw_len) return chunks_.size();
  return static_cast<size_t>(it - chunks_.begin());
}

uint32_t ShardReaderImpl::TensorAt(uint64_t offset) const {
  // The last tensor starting at or before `offset`: empty tensors share their start with the
  // next one and are skipped.
  auto it = std::upper_bound(tensor_start_.begin(), tensor_start_.end(), offset);
  return static_cast<uint32_t>(it - tensor_start_.begin() - 1);
}

absl::Status ShardReaderImpl::Hold(size_t chunk, uint32_t tensor, uint64_t hash_from) {
  if (cur_ != nullptr && cur_->chunk == chunk) return absl::OkStatus();
  Recycle(std::move(cur_));
  RETURN_IF_ERROR(Take(chunk, tensor, &cur_));
  if (!cur_->crc_pending) return absl::OkStatus();
  absl::Status s = VerifyHeld(tensor, hash_from);
  if (!s.ok()) Recycle(std::move(cur_));  // no byte of it is handed out, now or later
  return s;
}

// One pass over a raw chunk in cache-sized blocks: each block's CRC-32C, then (streaming) the
// same block, still in cache, into the tensor digests, as CopyOut would hash it for a stream
// that goes on from `hash_from` to the chunk's end. For a restore through the server (no copy
// on this side) that is one read of the bytes from memory instead of two.
absl::Status ShardReaderImpl::VerifyHeld(uint32_t tensor, uint64_t hash_from) {
  const ChunkRecord& c = chunks_[cur_->chunk];
  const uint64_t start = c.header.stream_offset;
  uint32_t crc = 0;
  int64_t mismatch = -1;
  for (size_t done = 0; done < c.header.raw_len; done += kVerifyBlock) {
    const size_t len = std::min<size_t>(kVerifyBlock, c.header.raw_len - done);
    crc = Crc32cExtend(crc, cur_->data + done, len);
    const uint64_t end = start + done + len;
    if (hash_from < end) HashHeld(std::max(hash_from, start + done), end, &mismatch);
  }
  if (crc != c.header.crc_raw) {
    hash_tensor_ = -1;
    if (cur_->shared != nullptr) engine_->shared_records()->Forget(cur_->shared.get());
    return Loss(tensor, PackedLoss(c, absl::DataLossError(kStoredCrcMismatch)));
  }
  if (mismatch >= 0) return DigestFailed(static_cast<uint32_t>(mismatch));
  cur_->crc_pending = false;
  cur_->prehashed = hash_from != kNoHash;
  return absl::OkStatus();
}

void ShardReaderImpl::HashHeld(uint64_t from, uint64_t to, int64_t* mismatch) {
  const uint64_t chunk_start = chunks_[cur_->chunk].header.stream_offset;
  while (from < to) {
    const uint32_t t = TensorAt(from);
    const uint64_t end = std::min(to, tensor_start_[t + 1]);
    HashRun(t, from, cur_->data + (from - chunk_start), end - from, mismatch);
    from = end;
  }
}

void ShardReaderImpl::HashRun(uint32_t t, uint64_t from, const uint8_t* p, size_t n,
                              int64_t* mismatch) {
  if (from == tensor_start_[t]) {
    digest_.Reset();
    hash_tensor_ = t;
    hash_next_ = from;
  }
  if (hash_tensor_ != static_cast<int64_t>(t) || hash_next_ != from) {
    hash_tensor_ = -1;
    return;
  }
  digest_.Update(p, n);
  hash_next_ += n;
  if (hash_next_ == tensor_start_[t + 1]) {
    hash_tensor_ = -1;
    if (digest_.FinishHex() != info_.tensors[t].digest && *mismatch < 0) *mismatch = t;
  }
}

absl::Status ShardReaderImpl::Take(size_t chunk, uint32_t tensor, std::shared_ptr<Slot>* out) {
  while (!window_.empty() && window_.front()->chunk != chunk) {
    Cancel();  // a jump: drop the read-ahead
  }
  size_t next = window_.empty() ? chunk : window_.back()->chunk + 1;
  // Chunks still lent out (ReadShared) count against the window: the reader's memory stays
  // within window_limit_ chunks plus the one it holds, as the read budget assumes.
  Reclaim();
  while ((window_.empty() || window_.size() + lent_.size() < window_limit_) &&
         next < chunks_.size() &&
         (next == chunk || chunks_[next].header.stream_offset < read_end_)) {
    if (!Schedule(next, /*must=*/window_.empty())) break;
    ++next;
  }
  std::shared_ptr<Slot> s = window_.front();
  window_.pop_front();
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](bool* d) { return *d; }, &s->done));
  }
  if (!s->status.ok()) return Loss(tensor, PackedLoss(chunks_[chunk], s->status));
  *out = std::move(s);
  return absl::OkStatus();
}

void ShardReaderImpl::Cancel() {
  for (auto& s : window_) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(+[](bool* d) { return *d; }, &s->done));
    }
    Recycle(std::move(s));
  }
  window_.clear();
}

absl::Status ShardReaderImpl::ReadTensor(size_t index, void* out, size_t out_len) {
  if (index >= info_.tensors.size()) {
    return absl::NotFoundError(absl::StrCat("tensor index ", index, " out of range for ",
                                            Where(job_, step_, info_.rank)));
  }
  const TensorSpec& t = info_.tensors[index].spec;
  if (out_len != t.byte_length) {
    return absl::InvalidArgumentError(absl::StrCat("buffer of ", out_len, " bytes for tensor of ",
                                                   t.byte_length, " at ",
                                                   Where(job_, step_, info_.rank, t.name)));
  }
  Digester digest(info_.digest_algo);
  uint8_t* dst = static_cast<uint8_t*>(out);
  PopulateAhead populate(out, out_len);  // a fresh destination faulted in ahead of the copy
  const uint64_t end = tensor_start_[index + 1];
  uint64_t pos = tensor_start_[index];
  while (pos < end) {
    // Chunks are in stream order and tile the shard: the next one starts where this ends.
    const size_t i = ChunkAt(pos);
    if (i == chunks_.size()) break;
    RETURN_IF_ERROR(Hold(i, static_cast<uint32_t>(index), kNoHash));
    const ChunkHeader& h = chunks_[i].header;
    const size_t from = static_cast<size_t>(pos - h.stream_offset);
    const size_t len = static_cast<size_t>(std::min<uint64_t>(end - pos, h.raw_len - from));
    // One pass: copy a cache-sized block, then hash it from the cache.
    uint8_t* to = dst + (pos - tensor_start_[index]);
    for (size_t done = 0; done < len; done += kFuseBlock) {
      size_t n = std::min<size_t>(kFuseBlock, len - done);
      std::memcpy(to + done, cur_->data + from + done, n);
      digest.Update(to + done, n);
    }
    pos += len;
  }
  if (pos != tensor_start_[index + 1]) {
    return Loss(index, absl::DataLossError("chunks missing"));
  }
  if (digest.FinishHex() != info_.tensors[index].digest) {
    return Loss(index, DigestMismatch());
  }
  StorageStats::Get().raw_bytes_read->Add(static_cast<int64_t>(out_len));
  return absl::OkStatus();
}

// Copies chunk bytes to `dst` for the stream at `offset`, one cache-sized block at a time,
// hashing each block right after copying it while the stream runs through a tensor from its
// start; checks the tensor's digest when the stream reaches its end (before Read returns).
absl::Status ShardReaderImpl::CopyOut(uint32_t tensor, const uint8_t* src, uint64_t offset,
                                      uint8_t* dst, size_t n) {
  if (cur_->prehashed) {  // VerifyHeld hashed (and checked) the whole chunk already
    if (dst != nullptr) std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  int64_t mismatch = -1;
  if (dst == nullptr) HashRun(tensor, offset, src, n, &mismatch);  // ReadView: where they lie
  for (size_t done = 0; dst != nullptr && done < n; done += kFuseBlock) {
    size_t len = std::min(kFuseBlock, n - done);
    std::memcpy(dst + done, src + done, len);
    HashRun(tensor, offset + done, dst + done, len, &mismatch);
  }
  if (mismatch >= 0) return DigestFailed(static_cast<uint32_t>(mismatch));
  return absl::OkStatus();
}

absl::Status ShardReaderImpl::CheckKnownBad(uint64_t from, uint64_t to) {
  const uint64_t total = tensor_start_.back();
  for (uint32_t t : bad_tensors_) {
    // A tensor with bytes in [from, to), or an empty one the range starts at or passes (one at
    // the very end: a range that reaches the end).
    const uint64_t s = tensor_start_[t];
    const bool touched = s == tensor_start_[t + 1]
                             ? from <= s && (s < to || (s == total && to == total))
                             : s < to && from < tensor_start_[t + 1];
    if (touched) return Loss(t, DigestMismatch());
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ShardReaderImpl::Read(uint64_t offset, void* out, size_t n) {
  if (read_start_ == UINT64_MAX) read_start_ = offset;
  uint64_t total = tensor_start_.back();
  if (offset >= total || n == 0) return 0;
  if (!bad_tensors_.empty()) {
    RETURN_IF_ERROR(CheckKnownBad(offset, std::min<uint64_t>(total, offset + n)));
  }
  uint8_t* dst = static_cast<uint8_t*>(out);
  // A fresh destination faulted in ahead of the copy (not for ReadView: no destination).
  PopulateAhead populate(out, out == nullptr ? 0 : std::min<uint64_t>(n, total - offset));
  size_t copied = 0;
  while (copied < n && offset < total) {
    const uint32_t tensor = TensorAt(offset);
    if (cur_ == nullptr || offset < chunks_[cur_->chunk].header.stream_offset ||
        offset >= chunks_[cur_->chunk].header.stream_offset + cur_->size) {
      const size_t i = ChunkAt(offset);
      if (i == chunks_.size()) {
        return Loss(tensor, absl::DataLossError(absl::StrCat("no chunk holds offset ", offset)));
      }
      RETURN_IF_ERROR(Hold(i, tensor, offset));
    }
    uint64_t start = chunks_[cur_->chunk].header.stream_offset;
    size_t in_chunk = static_cast<size_t>(offset - start);
    // Up to the end of the chunk and of the tensor (a packed chunk holds several).
    size_t take = static_cast<size_t>(std::min<uint64_t>(
        {n - copied, cur_->size - in_chunk, tensor_start_[tensor + 1] - offset}));
    RETURN_IF_ERROR(CopyOut(tensor, cur_->data + in_chunk, offset, dst + copied, take));
    copied += take;
    offset += take;
    if (dst == nullptr) break;  // ReadView: the bytes stay in cur_, one chunk at a time
  }
  StorageStats::Get().raw_bytes_read->Add(static_cast<int64_t>(copied));
  return copied;
}

// Read with no destination: it positions cur_ on the chunk holding `offset`, hashes the bytes
// in place and stops at the chunk's end.
absl::StatusOr<size_t> ShardReaderImpl::ReadView(uint64_t offset, size_t n,
                                                 const uint8_t** data) {
  // From now on raw chunks are CRC-checked by this thread in one pass with the digests
  // (VerifyHeld), not in the decode pool.
  defer_crc_.store(true, std::memory_order_relaxed);
  ASSIGN_OR_RETURN(size_t got, Read(offset, nullptr, n));
  if (got > 0) *data = cur_->data + (offset - chunks_[cur_->chunk].header.stream_offset);
  return got;
}

absl::StatusOr<size_t> ShardReaderImpl::ReadShared(uint64_t offset, size_t n,
                                                   const uint8_t** data,
                                                   std::shared_ptr<const void>* hold) {
  ASSIGN_OR_RETURN(size_t got, ReadView(offset, n, data));
  if (got > 0) *hold = std::shared_ptr<const void>(cur_, *data);  // shares the slot's ownership
  return got;
}

}  // namespace

absl::Status ReadChunk(EngineImpl* engine, const std::string& job, int64_t step, int32_t rank,
                       const std::string& tensor, const ChunkRecord& chunk,
                       ChunkDecoder* decoder, uint8_t* out) {
  auto loss = [&](const absl::Status& s) { return ReadFailure(Where(job, step, rank, tensor), s); };
  auto file = OpenSegment(engine, job, step, rank, chunk.segment);
  if (!file.ok()) return loss(file.status());
  AlignedBuffer buf(AlignUp(chunk.header.record_len()));
  absl::Status s = ReadRecord(file->get(), chunk, &buf);
  if (s.ok()) {
    s = decoder->Decode(buf.data(), chunk.header.record_len(), &chunk.header, out,
                        chunk.header.raw_len);
  }
  return s.ok() ? s : loss(s);
}

absl::StatusOr<std::unique_ptr<ShardReader>> NewShardReader(EngineImpl* engine,
                                                            ShardRecord rec) {
  ASSIGN_OR_RETURN(std::vector<ChunkRecord> chunks,
                   engine->LoadChunks(rec.spec.job, rec.spec.step, rec.spec.rank,
                                      rec.chunk_count));
  std::sort(chunks.begin(), chunks.end(), [](const ChunkRecord& a, const ChunkRecord& b) {
    return a.header.stream_offset < b.header.stream_offset;
  });
  ASSIGN_OR_RETURN(ShardInfo info, EngineImpl::MakeShardInfo(rec, chunks));
  auto r = std::make_unique<ShardReaderImpl>(engine, std::move(info), std::move(chunks),
                                             rec.spec.job, rec.spec.step);
  RETURN_IF_ERROR(r->Open());
  return std::unique_ptr<ShardReader>(std::move(r));
}

}  // namespace storage
}  // namespace gradsnap
