// ShardWriterImpl: cuts a shard's byte stream into chunks, encodes them on a small thread pool,
// hashes each tensor, and appends the records to segment files.
//
// OVERVIEW
//   Append() makes one pass over every byte: it copies the caller's bytes straight into a
//   record buffer (after the header space) in cache-sized blocks (kFuseBlock), and while each
//   block is in cache extends the chunk's CRC-32C and the tensor's digest (XXH3-128 or
//   SHA-256, the shard's algorithm) with it. The stream is in order on the caller thread, so
//   the digest needs no reordering. A full chunk is dispatched as a job: encoded on a pool
//   thread (ChunkEncoder, in place unless compression pays; the raw CRC is already known) and
//   queued on the SegmentWriter (io_uring). Chunk offsets in the segment follow completion
//   order; the metadata records where each chunk landed.
//   Small tensors (at most kSmallChunkBytes) share chunks: consecutive ones are packed into
//   one chunk of up to EngineOptions::pack_bytes (format 3, docs/format.md "Packed chunks"),
//   so a shard of many small tensors is written in large records, not one per tensor.
//   Compression: a chunk that stays raw never waits for an encoder (its header is written
//   and it is queued for the disk on the appending thread); a chunk tries compression on the
//   pool only while the disk is behind and an encoder that leaves a core to the appending
//   thread is idle (adaptive bypass), and the encoder probes a sample before compressing it
//   all, so incompressible data costs little. The probe's timed codec speeds and the disk
//   rate this writer measures decide whether the chunk is kept compressed
//   (CompressionPays: only when neither this write nor the restore can be slower).
//   Flush(): wait for every job, fdatasync the segments (and the directory for new files),
//   then one synced RocksDB batch with the new chunk keys and the shard record. Finish() first
//   appends the shard footer (storage/footer.h: the shard's manifest, so the catalog can be
//   rebuilt from the segments) and syncs it with the rest.
//
// ERROR HANDLING
//   The first failure (I/O, hash mismatch) is sticky and returned by Append/Flush/Finish.
//   Nothing that failed ever reaches the metadata, so a reopened writer resumes at the last
//   successful Flush.
//
// THREAD SAFETY
//   One caller thread at a time; internal pool threads synchronize through mu_ and io_mu_.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/digest.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/epoch.h"
#include "storage/footer.h"
#include "storage/segment_writer.h"
#include "storage/storage_stats.h"
#include "storage/task_pool.h"

namespace gradsnap {
namespace storage {
namespace {

int EncodeThreads(const EngineOptions& o) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return o.encode_threads >= 0 ? o.encode_threads : std::clamp(cores, 1, 16);
}

// Full chunks one writer keeps in flight: enough to keep the ring full and every encoder busy,
// and no more (memory).
int MaxJobs(const EngineOptions& o) {
  return std::min(o.queue_depth, std::max(16, 2 * EncodeThreads(o) + 8));
}

// Bytes copied, CRC'ed and hashed at a time: small enough to stay in L1/L2 between the copy
// and the two checksums, large enough to amortize the calls.
constexpr size_t kFuseBlock = 64 << 10;
// Small chunks (kSmallChunkBytes) take small buffers, so more of them may be in flight: many
// small tensors still keep the disk queue full.
constexpr int kSmallJobsPerJob = 8;
// Adaptive compression: while the cost model rules compression out, one chunk in this many
// still probes (its speeds); the disk rate counts once this much has been written.
constexpr uint32_t kReprobeChunks = 16;
constexpr uint64_t kMinRateBytes = 8 << 20;

struct Job {
  std::unique_ptr<AlignedBuffer> raw;  // record buffer with raw bytes after the header
  DType dtype = DType::kU8;            // for the shuffle filter (kU8: none, mixed tensors)
  std::unique_ptr<AlignedBuffer> alt;  // compressed record, when compression pays
  size_t n = 0;
  uint32_t crc_raw = 0;                // CRC-32C of the raw bytes, computed while copying
  size_t weight = 0;                   // memory it may hold: its raw and compressed buffers
  uint32_t tensor = 0;
  uint32_t index_in_tensor = 0;
  uint32_t chunk_index = 0;            // in the shard's stream
  uint64_t stream_offset = 0;
  bool try_compress = true;
  ChunkRecord record;
};

// Sets the durable end of segment `seq` in `refs`, adding it when not listed yet.
void NoteSegmentEnd(std::vector<SegmentRef>* refs, uint32_t seq, uint64_t end) {
  for (SegmentRef& r : *refs) {
    if (r.seq == seq) {
      r.durable_end = end;
      return;
    }
  }
  refs->push_back(SegmentRef{seq, end});
}

class ShardWriterImpl : public ShardWriter {
 public:
  ShardWriterImpl(EngineImpl* engine, ShardRecord rec);
  ~ShardWriterImpl() override;
  absl::Status Init();

  uint64_t total_size() const override { return total_; }
  uint64_t written_size() const override { return written_; }
  uint64_t committed_size() const override { return committed_; }
  absl::Status Append(const void* data, size_t n) override;
  absl::Status Flush() override { return Persist(/*finish=*/false); }
  absl::Status Finish() override;

 private:
  absl::Status ResumeHash(uint32_t tensor);
  void StartTensorDigest();
  void HashBytes(const uint8_t* data, size_t n);
  void StartChunk();
  uint64_t TensorLength(uint32_t t) const {
    return tensor_end_[t] - (t == 0 ? 0 : tensor_end_[t - 1]);
  }
  // Small tensors share chunks of at most PackLimit() bytes (0: packing is off).
  size_t PackLimit() const { return std::min(opt_.pack_bytes, opt_.chunk_bytes); }
  bool IsSmall(uint32_t t) const { return TensorLength(t) <= kSmallChunkBytes; }
  // The first tensor after t with bytes; tensor_end_.size() when none.
  uint32_t NextWithBytes(uint32_t t) const;
  // At the end of tensor_: whether the next tensor joins the current (packed) chunk.
  bool PackNext() const;
  // The tensors whose bytes lie in the chunk being dispatched, [cur_start_, written_).
  std::vector<ChunkMember> ChunkMembers() const;
  // A record buffer for a chunk of `raw` bytes: a small one when that is enough.
  std::unique_ptr<AlignedBuffer> GetRecordBuffer(size_t raw);
  void PutRecordBuffer(std::unique_ptr<AlignedBuffer> buf);
  // Reserves in the engine's pool, faulted in, the full-size record buffers this writer can
  // hold at once (reserved_), so they are this writer's until it closes.
  void ReserveBuffers();
  void Dispatch();
  void AdvanceTensor();
  void Encode(Job* job, ChunkEncoder* enc);
  void SubmitIo(Job* job);
  void Release(Job* job, const absl::Status& s);
  // The policy's inputs now (thread-safe).
  CompressionCosts Costs();
  void NoteProbe(const ProbeResult& p);
  void NoteWriteQueued();
  void NoteWriteDone(size_t bytes);
  absl::Status Persist(bool finish);
  absl::Status OpenSegmentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  void RetireSegments(std::vector<std::pair<uint32_t, std::unique_ptr<SegmentWriter>>> retire)
      ABSL_LOCKS_EXCLUDED(io_mu_, mu_);
  absl::Status AppendFooter(const ShardRecord& next, const std::vector<ChunkRecord>& chunks);
  absl::Status SyncSegments();
  void WaitIdle();
  // Backpressure: buffers of at most max_jobs_ full chunks in flight, and at most
  // kSmallJobsPerJob times as many jobs when they are small chunks.
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ < max_jobs_ * kSmallJobsPerJob &&
           inflight_weight_ + next_weight_ <= max_weight_;
  }

  // Constant after construction.
  EngineImpl* const engine_;
  const EngineOptions& opt_;
  const std::string key_;
  std::vector<uint64_t> tensor_end_;  // stream offset where tensor i ends
  uint64_t total_ = 0;
  int max_jobs_ = 1;
  size_t max_weight_ = 0;             // max_jobs_ full chunks' raw and compressed buffers
  std::atomic<int> io_pending_{0};     // jobs queued on a SegmentWriter, not yet written
  int decoders_ = 1;                   // cores a restore decodes on (CompressionCosts)
  std::atomic<int> compressing_{0};    // jobs trying compression on the pool
  int max_compressors_ = 1;            // encoders that may compress at once
  std::atomic<bool> ring_{false};      // the current segment writes through io_uring

  // Caller-thread state.
  ShardRecord rec_;                   // as last persisted
  uint64_t written_ = 0;
  uint64_t committed_ = 0;
  uint32_t tensor_ = 0;               // tensor the stream is in
  uint32_t tensor_chunks_ = 0;        // chunks dispatched for tensor_
  uint32_t next_chunk_index_ = 0;
  std::unique_ptr<AlignedBuffer> cur_;
  size_t cur_len_ = 0;
  uint32_t cur_crc_ = 0;              // CRC-32C of cur_'s bytes so far
  uint64_t cur_start_ = 0;
  bool finished_ = false;
  bool waited_ = false;               // the last Dispatch waited for room (disk-bound)
  Digester digest_;                   // tensor_'s bytes so far, the shard's algorithm
  // tensor_'s bytes for its expected SHA-256, when it has one and digest_ is not SHA-256.
  std::unique_ptr<Digester> sha256_;
  bool check_sha256_ = false;         // sha256_ is in use for tensor_
  // Per tensor: consecutive chunks that did not compress (adaptive bypass; pool threads).
  std::unique_ptr<std::atomic<int>[]> no_gain_;

  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;    // jobs not yet released
  size_t inflight_weight_ ABSL_GUARDED_BY(mu_) = 0;  // sum of their weights
  size_t next_weight_ ABSL_GUARDED_BY(mu_) = 0;      // of the job waiting to be dispatched
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<ChunkRecord> completed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> digests_ ABSL_GUARDED_BY(mu_);  // per tensor, "" until known

  // The compression policy's measurements (CompressionCosts): the disk write rate (bytes
  // written per second while writes were queued) and the codec speeds of recent probes.
  absl::Mutex rate_mu_;
  int64_t busy_since_ns_ ABSL_GUARDED_BY(rate_mu_) = 0;  // when io_pending_ last left 0
  int64_t busy_ns_ ABSL_GUARDED_BY(rate_mu_) = 0;        // earlier busy periods
  uint64_t disk_bytes_ ABSL_GUARDED_BY(rate_mu_) = 0;    // written in them
  double encode_bps_ ABSL_GUARDED_BY(rate_mu_) = 0;      // moving averages of probes
  double decode_bps_ ABSL_GUARDED_BY(rate_mu_) = 0;

  // Full-size record buffers reserved in the engine's pool when the writer opened and faulted
  // in then (ReserveBuffers), handed out before the pool's others and set aside for this
  // writer again when their write completes (no other writer takes them meanwhile); back to
  // the pool when the writer closes. A writer keeps up to max_jobs_ chunks in flight, and how
  // many it reaches depends on how fast the copy runs against the disk: growing the pool on
  // demand faulted new buffers inside the copy, pass after pass, until the copy was fast
  // enough to reach the maximum (storage_bench: engine write CPU per GB 1.10, 0.70, 0.34 over
  // three passes at 256 MiB). Reserving them all up front grows the pool to its steady size
  // in the first write, and outside the copy loop.
  BufferPool::Reservation reserved_{engine_->record_pool()};

  absl::Mutex io_mu_;
  std::unique_ptr<SegmentWriter> seg_ ABSL_GUARDED_BY(io_mu_);
  uint32_t seg_seq_ ABSL_GUARDED_BY(io_mu_) = 0;
  // Bytes promised to seg_ (appended, or about to be by an encoder that left io_mu_), and how
  // many of those appends were not handed to it yet: a roll goes by what is promised, so a
  // segment never grows past segment_bytes, and a sealed segment is closed only once every
  // append promised to it was handed over.
  uint64_t seg_promised_ ABSL_GUARDED_BY(io_mu_) = 0;
  int seg_unsubmitted_ ABSL_GUARDED_BY(io_mu_) = 0;
  // Segments rolled over since the last commit, named by the next one. Each is retired (its
  // writes waited for, synced, its file, ring and ring thread closed) at a later roll once no
  // append to it is outstanding, so a writer holds one open segment however many it fills.
  struct SealedSegment {
    uint32_t seq = 0;
    std::unique_ptr<SegmentWriter> writer;  // null once retired
    uint64_t end = 0;                        // the retired file's end
    int unsubmitted = 0;
    uint64_t End() const { return writer != nullptr ? writer->end() : end; }
  };
  std::vector<SealedSegment> sealed_ ABSL_GUARDED_BY(io_mu_);
  // Sets each sealed segment's end in `refs` (NoteSegmentEnd).
  void NoteSealedLocked(std::vector<SegmentRef>* refs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) {
    for (const SealedSegment& s : sealed_) NoteSegmentEnd(refs, s.seq, s.End());
  }
  bool new_files_ ABSL_GUARDED_BY(io_mu_) = false;

  std::unique_ptr<TaskPool<ChunkEncoder>> pool_;  // last: destroyed (joined) first
};

ShardWriterImpl::ShardWriterImpl(EngineImpl* engine, ShardRecord rec)
    : engine_(engine),
      opt_(engine->options()),
      key_(ShardKey(rec.spec.job, rec.spec.step, rec.spec.rank)),
      rec_(std::move(rec)),
      digest_(rec_.digest_algo) {
  for (const TensorSpec& t : rec_.spec.tensors) {
    total_ += t.byte_length;
    tensor_end_.push_back(total_);
  }
  rec_.tensor_digests.resize(rec_.spec.tensors.size());
  no_gain_ = std::make_unique<std::atomic<int>[]>(rec_.spec.tensors.size() + 1);
  written_ = committed_ = rec_.committed_size;
  const int threads = EncodeThreads(opt_);
  max_jobs_ = MaxJobs(opt_);
  max_weight_ = static_cast<size_t>(max_jobs_) * 2 * engine_->record_pool()->buffer_capacity();
  next_chunk_index_ = rec_.chunk_count;
  finished_ = rec_.committed;  // reopening a committed shard: nothing left to do
  CodecOptions co{opt_.zstd_level, opt_.shuffle, opt_.max_compressed_ratio};
  // Compression leaves one core to the appending thread (its copy + CRC + digest pass is
  // what sets the pace when compression is off); a restore likewise leaves one to the
  // thread that copies and hashes the decoded bytes.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  max_compressors_ = std::max(1, std::min(threads, cores - 1));
  decoders_ = std::max(1, cores - 1);
  pool_ = std::make_unique<TaskPool<ChunkEncoder>>(
      threads, [co] { return std::make_unique<ChunkEncoder>(co); });
}

ShardWriterImpl::~ShardWriterImpl() {
  WaitIdle();
  pool_.reset();
  reserved_.Release();
  engine_->ReleaseWriter(key_);
}

// Waits until every dispatched job has been encoded and written.
void ShardWriterImpl::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](int* p) { return *p == 0; }, &pending_));
}

absl::Status ShardWriterImpl::Init() {
  {
    absl::MutexLock lock(&mu_);
    digests_ = rec_.tensor_digests;
  }
  uint32_t max_seq = 0;
  for (const SegmentRef& s : rec_.segments) max_seq = std::max(max_seq, s.seq + 1);
  {
    absl::MutexLock lock(&io_mu_);
    seg_seq_ = max_seq;
  }
  // Position the stream at committed_size and rebuild the partial tensor's hash from disk.
  // Tensors the durable prefix covers already have their digests.
  tensor_ = 0;
  while (tensor_ < tensor_end_.size() &&
         (tensor_end_[tensor_] < written_ ||
          (tensor_end_[tensor_] == written_ && !rec_.tensor_digests[tensor_].empty()))) {
    ++tensor_;
  }
  StartTensorDigest();
  if (tensor_ < tensor_end_.size()) {
    uint64_t start = tensor_end_[tensor_] - rec_.spec.tensors[tensor_].byte_length;
    if (written_ > start) RETURN_IF_ERROR(ResumeHash(tensor_));
  }
  AdvanceTensor();  // finalizes empty tensors at the current position
  if (!finished_) ReserveBuffers();
  return engine_->fs()->CreateDirs(
      engine_->CheckpointDir(rec_.spec.job, rec_.spec.step));
}

absl::Status ShardWriterImpl::ResumeHash(uint32_t tensor) {
  const ShardSpec& s = rec_.spec;
  ASSIGN_OR_RETURN(std::vector<ChunkRecord> chunks,
                   engine_->LoadChunks(s.job, s.step, s.rank, rec_.chunk_count));
  std::sort(chunks.begin(), chunks.end(), [](const ChunkRecord& a, const ChunkRecord& b) {
    return a.header.stream_offset < b.header.stream_offset;
  });
  std::vector<uint8_t> buf;
  ChunkDecoder dec;
  // The tensor's durable bytes, from every chunk that holds some (a packed chunk holds the
  // tensor's first part after other tensors).
  const uint64_t start = tensor_end_[tensor] - s.tensors[tensor].byte_length;
  for (const ChunkRecord& c : chunks) {
    const uint64_t lo = std::max(start, c.header.stream_offset);
    const uint64_t hi = std::min(tensor_end_[tensor], c.header.stream_offset + c.header.raw_len);
    if (lo >= hi) continue;
    buf.resize(c.header.raw_len);
    RETURN_IF_ERROR(ReadChunk(engine_, s.job, s.step, s.rank, s.tensors[tensor].name, c,
                              &dec, buf.data()));
    HashBytes(buf.data() + (lo - c.header.stream_offset), hi - lo);
    ++tensor_chunks_;
  }
  return absl::OkStatus();
}

void ShardWriterImpl::ReserveBuffers() {
  // At most the chunks in flight and the one being filled, and no more than the rest of the
  // shard needs (bytes in small-tensor chunks counted as full chunks: an upper bound).
  const uint64_t chunks = (total_ - written_ + opt_.chunk_bytes - 1) / opt_.chunk_bytes;
  const size_t want =
      static_cast<size_t>(std::min<uint64_t>(chunks, ShardWriterReservedBuffers(opt_)));
  reserved_.Reserve(want);
}

std::unique_ptr<AlignedBuffer> ShardWriterImpl::GetRecordBuffer(size_t raw) {
  if (raw <= kSmallChunkBytes && opt_.chunk_bytes > kSmallChunkBytes) {
    return engine_->small_record_pool()->Get();
  }
  return reserved_.Get();
}

void ShardWriterImpl::PutRecordBuffer(std::unique_ptr<AlignedBuffer> buf) {
  if (buf == nullptr) return;
  if (opt_.chunk_bytes > kSmallChunkBytes &&
      buf->capacity() == engine_->small_record_pool()->buffer_capacity()) {
    engine_->small_record_pool()->Put(std::move(buf));
    return;
  }
  // Kept for this writer's next chunks rather than left to any caller of the engine's pool,
  // where another writer opening now would take it and leave this one to allocate in its copy.
  reserved_.Put(std::move(buf));
}

// Resets the running digests for tensor_ (caller thread).
void ShardWriterImpl::StartTensorDigest() {
  digest_.Reset();
  check_sha256_ = tensor_ < tensor_end_.size() && !rec_.spec.tensors[tensor_].sha256.empty() &&
                  rec_.digest_algo != DigestAlgo::kSha256;
  if (check_sha256_) {
    if (sha256_ == nullptr) sha256_ = std::make_unique<Digester>(DigestAlgo::kSha256);
    sha256_->Reset();
  }
}

void ShardWriterImpl::HashBytes(const uint8_t* data, size_t n) {
  digest_.Update(data, n);
  if (check_sha256_) sha256_->Update(data, n);
}

void ShardWriterImpl::StartChunk() {
  uint64_t want = std::min<uint64_t>(opt_.chunk_bytes, tensor_end_[tensor_] - written_);
  const uint32_t next = NextWithBytes(tensor_);
  if (PackLimit() > 0 && IsSmall(tensor_) && next < tensor_end_.size() && IsSmall(next)) {
    want = PackLimit();  // small tensors follow: a buffer they can share
  }
  cur_ = GetRecordBuffer(want);
  cur_len_ = 0;
  cur_crc_ = 0;
  cur_start_ = written_;
}

uint32_t ShardWriterImpl::NextWithBytes(uint32_t t) const {
  uint32_t next = t + 1;
  while (next < tensor_end_.size() && TensorLength(next) == 0) ++next;
  return next;
}

bool ShardWriterImpl::PackNext() const {
  if (PackLimit() == 0 || !IsSmall(tensor_)) return false;
  const uint32_t next = NextWithBytes(tensor_);
  return next < tensor_end_.size() && IsSmall(next) &&
         cur_len_ + TensorLength(next) <= PackLimit() &&
         cur_len_ + TensorLength(next) <= cur_->capacity() - MaxRecordSize(0);
}

std::vector<ChunkMember> ShardWriterImpl::ChunkMembers() const {
  std::vector<ChunkMember> members;
  const uint64_t end = cur_start_ + cur_len_;
  // From the tensor holding the chunk's first byte (the first to end past it).
  const auto first = std::upper_bound(tensor_end_.begin(), tensor_end_.end(), cur_start_);
  for (auto t = static_cast<uint32_t>(first - tensor_end_.begin());
       t < tensor_end_.size() && tensor_end_[t] - TensorLength(t) < end; ++t) {
    const uint64_t lo = std::max(cur_start_, tensor_end_[t] - TensorLength(t));
    const uint64_t hi = std::min(end, tensor_end_[t]);
    if (lo >= hi) continue;
    members.push_back(ChunkMember{t, static_cast<uint32_t>(lo - cur_start_),
                                  static_cast<uint32_t>(hi - lo)});
  }
  return members;
}

// Moves tensor_ past every tensor the stream has fully passed, finishing each one's digest
// (and checking its expected SHA-256). Persist() stores a digest once all the tensor's
// chunks are durable, which it waits for.
void ShardWriterImpl::AdvanceTensor() {
  while (tensor_ < tensor_end_.size() && written_ == tensor_end_[tensor_]) {
    std::string hex = digest_.FinishHex();
    std::string sha = check_sha256_ ? sha256_->FinishHex() : hex;
    const TensorSpec& t = rec_.spec.tensors[tensor_];
    {
      absl::MutexLock lock(&mu_);
      if (!t.sha256.empty() && t.sha256 != sha && error_.ok()) {
        error_ = absl::DataLossError(absl::StrCat(
            "SHA-256 mismatch: expected ", t.sha256, ", received bytes hash to ", sha, " for ",
            Where(rec_.spec.job, rec_.spec.step, rec_.spec.rank, t.name)));
      }
      digests_[tensor_] = std::move(hex);
    }
    ++tensor_;
    tensor_chunks_ = 0;
    StartTensorDigest();
  }
}

absl::Status ShardWriterImpl::Append(const void* data, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (finished_) return absl::FailedPreconditionError("shard writer already finished");
  if (n > total_ - written_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "append of ", n, " bytes past the shard's end (", written_, " of ", total_, ") for ",
        Where(rec_.spec.job, rec_.spec.step, rec_.spec.rank)));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    if (cur_ == nullptr) StartChunk();
    size_t room = std::min<uint64_t>(opt_.chunk_bytes - cur_len_, tensor_end_[tensor_] - written_);
    size_t take = std::min({room, n, kFuseBlock});
    // One pass: copy a block, then CRC and hash it while it is in cache.
    uint8_t* dst = cur_->data() + kChunkHeaderSize + cur_len_;
    std::memcpy(dst, p, take);
    cur_crc_ = Crc32cExtend(cur_crc_, dst, take);
    HashBytes(dst, take);
    cur_len_ += take;
    written_ += take;
    p += take;
    n -= take;
    if (cur_len_ == opt_.chunk_bytes || (written_ == tensor_end_[tensor_] && !PackNext())) {
      Dispatch();
    }
    AdvanceTensor();
  }
  return absl::OkStatus();
}

void ShardWriterImpl::Dispatch() {
  if (cur_ == nullptr || cur_len_ == 0) return;
  auto* job = new Job;
  job->raw = std::move(cur_);
  job->n = cur_len_;
  job->crc_raw = cur_crc_;
  job->record.members = ChunkMembers();
  job->tensor = job->record.members.front().tensor;
  job->dtype = rec_.spec.tensors[job->tensor].dtype;
  for (const ChunkMember& m : job->record.members) {
    if (DTypeSize(rec_.spec.tensors[m.tensor].dtype) != DTypeSize(job->dtype)) {
      job->dtype = DType::kU8;  // mixed element sizes: no shuffle
    }
  }
  if (job->record.members.size() == 1) job->record.members.clear();  // one tensor: not packed
  job->index_in_tensor = tensor_chunks_++;
  job->chunk_index = next_chunk_index_++;
  job->stream_offset = cur_start_;
  cur_len_ = 0;
  // Adaptive bypass: after two chunks of a tensor that did not compress, only every 8th
  // chunk tries again.
  // Throughput bypass: compress only while the disk is behind (enough writes queued) and
  // the encoders keep up (no chunk waits for one), so encoding time hides behind I/O and
  // compression never lowers throughput, also when other work takes the cores.
  // The disk sets the pace when the last chunk had to wait for room (backpressure): only
  // then is there CPU time that compression can use without slowing the write.
  bool disk_busy = !opt_.adapt_compression ||
                   (waited_ && io_pending_.load() >= max_jobs_ * 3 / 4 &&
                    compressing_.load() < max_compressors_);
  job->try_compress = opt_.zstd_level > 0 && disk_busy &&
                      (no_gain_[job->tensor].load() < 2 || job->index_in_tensor % 8 == 0);
  // Cost model (CompressionPays): once the measured codec speeds say no chunk can pay, whatever
  // its ratio, only every kReprobeChunks-th chunk probes, to follow changes in the speeds.
  if (job->try_compress && opt_.adapt_compression &&
      job->chunk_index % kReprobeChunks != 0) {
    const CompressionCosts c = Costs();
    if (c.encode_bps > 0 && c.disk_bps > 0 && !CompressionPays(c, 0, 1)) {
      job->try_compress = false;
    }
  }
  {
    // Backpressure: at most max_jobs_ chunks (and their buffers) in flight.
    absl::MutexLock lock(&mu_);
    job->weight = 2 * job->raw->capacity();
    next_weight_ = job->weight;
    waited_ = !HasRoom();
    mu_.Await(absl::Condition(this, &ShardWriterImpl::HasRoom));
    ++pending_;
    inflight_weight_ += job->weight;
  }
  if (!job->try_compress && ring_.load()) {
    // Stays raw: only its header to write, here, so it never waits behind a compression
    // (with io_uring the write is only queued; pwrite writes go through the pool).
    Encode(job, nullptr);
    return;
  }
  compressing_.fetch_add(1);
  pool_->Run([this, job](ChunkEncoder* enc) {
    Encode(job, enc);
    compressing_.fetch_sub(1);
  });
}

void ShardWriterImpl::Encode(Job* job, ChunkEncoder* enc) {
  if (enc == nullptr) {
    job->record.header =
        WriteRawHeader(job->raw->data(), job->n, job->crc_raw, job->stream_offset);
    job->record.tensor = job->tensor;
    SubmitIo(job);
    return;
  }
  bool in_alt = false;
  uint8_t* alt = nullptr;
  if (job->try_compress) {
    job->alt = GetRecordBuffer(job->n);
    alt = job->alt->data();
  }
  if (job->try_compress && opt_.adapt_compression) enc->SetCosts(Costs());
  ChunkHeader h = enc->EncodeInPlace(job->raw->data(), job->n, job->crc_raw, job->dtype,
                                     job->stream_offset, job->try_compress, alt, &in_alt);
  NoteProbe(enc->last_probe());
  if (job->try_compress) {
    if (in_alt) no_gain_[job->tensor].store(0); else no_gain_[job->tensor].fetch_add(1);
  }
  if (!in_alt && job->alt != nullptr) PutRecordBuffer(std::move(job->alt));
  job->record.header = h;
  job->record.tensor = job->tensor;
  SubmitIo(job);
}

void ShardWriterImpl::SubmitIo(Job* job) {
  const AlignedBuffer* buffer = job->alt != nullptr ? job->alt.get() : job->raw.get();
  uint8_t* rec = job->alt != nullptr ? job->alt->data() : job->raw->data();
  size_t len = job->record.header.record_len();
  size_t padded = AlignUp(len);
  std::memset(rec + len, 0, padded - len);
  SegmentWriter* w = nullptr;
  uint32_t seq = 0;
  std::vector<std::pair<uint32_t, std::unique_ptr<SegmentWriter>>> retire;
  // Segment data leaves the catalog room to delete (kSegmentFloorBytes): a full disk is
  // RESOURCE_EXHAUSTED here, as ENOSPC would be, with rm and gc still able to free space.
  std::atomic<uint64_t>& in_flight = engine_->segment_bytes_in_flight();
  if (opt_.catalog_reserve_bytes > 0) {
    const uint64_t free = FreeBytes(opt_.data_dir);
    if (free < padded + kSegmentFloorBytes + in_flight.load()) {
      Release(job, absl::ResourceExhaustedError(absl::StrCat(
                       "out of disk space: ", free, " bytes free under ", opt_.data_dir,
                       ", the last ", kSegmentFloorBytes,
                       " are kept so that rm and gc can free space")));
      return;
    }
  }
  {
    absl::MutexLock lock(&io_mu_);
    if (seg_ == nullptr || (seg_promised_ > 0 && seg_promised_ + padded > opt_.segment_bytes)) {
      absl::Status created = OpenSegmentLocked();
      if (!created.ok()) {
        Release(job, created);
        return;
      }
      // Earlier sealed segments only: the one just sealed still has writes on the disk's
      // queue, and waiting for them here would drain the queue at every roll.
      for (size_t i = 0; i + 1 < sealed_.size(); ++i) {
        SealedSegment& s = sealed_[i];
        if (s.writer != nullptr && s.unsubmitted == 0) retire.emplace_back(s.seq, std::move(s.writer));
      }
    }
    seq = seg_seq_ - 1;
    job->record.segment = seq;
    seg_promised_ += padded;
    ++seg_unsubmitted_;
    w = seg_.get();  // open until every append promised to it was handed over (see sealed_)
  }
  RetireSegments(std::move(retire));
  NoteWriteQueued();
  in_flight += padded;
  w->Append(
      rec, padded,
      [this, job, padded](const absl::Status& st, uint64_t offset) {
        engine_->segment_bytes_in_flight() -= padded;
        NoteWriteDone(st.ok() ? padded : 0);
        job->record.offset = offset;
        Release(job, st);
      },
      buffer);
  absl::MutexLock lock(&io_mu_);
  if (seq == seg_seq_ - 1) {
    --seg_unsubmitted_;
  } else {
    for (SealedSegment& s : sealed_) {
      if (s.seq == seq) --s.unsubmitted;
    }
  }
}

// Outside io_mu_: each writer's queued writes are waited for and synced, then it is closed.
// A failure fails the writer (error_), as a failed write does.
void ShardWriterImpl::RetireSegments(
    std::vector<std::pair<uint32_t, std::unique_ptr<SegmentWriter>>> retire) {
  for (auto& [seq, w] : retire) {
    absl::Status s = w->Sync();
    const uint64_t end = w->end();
    w.reset();
    {
      absl::MutexLock lock(&io_mu_);
      for (SealedSegment& e : sealed_) {
        if (e.seq == seq) e.end = end;
      }
    }
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      if (error_.ok()) error_ = s;
    }
  }
}

// Rolls to a new segment file: the old one finishes its queue and is synced by the next
// Persist().
absl::Status ShardWriterImpl::OpenSegmentLocked() {
  SegmentWriterOptions so{opt_.use_io_uring, opt_.use_direct_io, opt_.queue_depth};
  const ShardSpec& sp = rec_.spec;
  ASSIGN_OR_RETURN(std::unique_ptr<SegmentWriter> created,
                   SegmentWriter::Create(engine_->fs(),
                                         engine_->SegmentPath(sp.job, sp.step, sp.rank, seg_seq_),
                                         so));
  if (seg_ != nullptr) {
    sealed_.push_back(SealedSegment{seg_seq_ - 1, std::move(seg_), 0, seg_unsubmitted_});
  }
  seg_ = std::move(created);
  seg_promised_ = 0;
  seg_unsubmitted_ = 0;
  ring_.store(seg_->uses_io_uring());
  ++seg_seq_;
  new_files_ = true;
  return absl::OkStatus();
}

// Appends the shard footer (storage/footer.h) after every chunk record of the shard, in its
// current segment (a new one when this writer session wrote no chunk), and waits for the
// write. `next` is the shard record about to be committed; the footer carries it with the
// segments' durable ends as they will be once the footer is written.
absl::Status ShardWriterImpl::AppendFooter(const ShardRecord& next,
                                           const std::vector<ChunkRecord>& chunks) {
  const ShardSpec& sp = rec_.spec;
  ShardFooter f;
  // A writer already superseded writes no footer: its commit would be refused, and a footer
  // left behind would let a rebuild bring the zombie's shard back (storage/rebuild.h).
  RETURN_IF_ERROR(CheckJobEpoch(engine_->meta(), sp.job, sp.epoch));
  ASSIGN_OR_RETURN(f.job_epoch, CurrentJobEpoch(engine_->meta(), sp.job));
  ASSIGN_OR_RETURN(f.checkpoint, engine_->LoadCheckpoint(sp.job, sp.step));
  ASSIGN_OR_RETURN(f.chunks, engine_->LoadChunks(sp.job, sp.step, sp.rank, rec_.chunk_count));
  f.chunks.insert(f.chunks.end(), chunks.begin(), chunks.end());
  f.written_unix_ms = opt_.clock->NowUnixMillis();
  f.shard = next;
  SegmentWriter* w = nullptr;
  uint64_t off = 0;
  uint32_t seq = 0;
  {
    absl::MutexLock lock(&io_mu_);
    if (seg_ == nullptr) RETURN_IF_ERROR(OpenSegmentLocked());
    w = seg_.get();
    off = w->end();
    seq = seg_seq_ - 1;
    NoteSealedLocked(&f.shard.segments);
    NoteSegmentEnd(&f.shard.segments, seq, off);  // placeholder: the size does not depend on it
    NoteSegmentEnd(&f.shard.segments, seq, off + FooterSize(f));
  }
  std::string bytes = EncodeFooter(f);
  AlignedBuffer buf(bytes.size());
  std::memcpy(buf.data(), bytes.data(), bytes.size());
  absl::Status st;
  absl::Notification done;
  w->Append(buf.data(), bytes.size(), [&](const absl::Status& s, uint64_t at) {
    st = s;
    if (st.ok() && at != off) st = absl::InternalError("shard footer written out of place");
    done.Notify();
  });
  done.WaitForNotification();
  return st;
}

CompressionCosts ShardWriterImpl::Costs() {
  CompressionCosts c;
  c.encoders = max_compressors_;
  c.decoders = decoders_;
  absl::MutexLock lock(&rate_mu_);
  c.encode_bps = encode_bps_;
  c.decode_bps = decode_bps_;
  int64_t busy = busy_ns_;
  if (io_pending_.load() > 0) busy += MonotonicNanos() - busy_since_ns_;
  // A few MiB written before the rate counts: the first writes only fill the queue.
  if (busy > 0 && disk_bytes_ >= kMinRateBytes) {
    c.disk_bps = static_cast<double>(disk_bytes_) * 1e9 / static_cast<double>(busy);
  }
  return c;
}

void ShardWriterImpl::NoteProbe(const ProbeResult& p) {
  if (!p.ran || p.encode_bps <= 0 || p.decode_bps <= 0) return;
  auto average = [](double old, double now) { return old == 0 ? now : 0.75 * old + 0.25 * now; };
  absl::MutexLock lock(&rate_mu_);
  encode_bps_ = average(encode_bps_, p.encode_bps);
  decode_bps_ = average(decode_bps_, p.decode_bps);
}

void ShardWriterImpl::NoteWriteQueued() {
  absl::MutexLock lock(&rate_mu_);
  if (io_pending_.fetch_add(1) == 0) busy_since_ns_ = MonotonicNanos();
}

void ShardWriterImpl::NoteWriteDone(size_t bytes) {
  absl::MutexLock lock(&rate_mu_);
  disk_bytes_ += bytes;
  if (io_pending_.fetch_sub(1) == 1) busy_ns_ += MonotonicNanos() - busy_since_ns_;
}

// Called once per job, when its write completed or failed.
void ShardWriterImpl::Release(Job* job, const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    if (s.ok()) completed_.push_back(job->record);
  }
  const size_t weight = job->weight;
  PutRecordBuffer(std::move(job->raw));
  PutRecordBuffer(std::move(job->alt));
  delete job;
  absl::MutexLock lock(&mu_);
  --pending_;
  inflight_weight_ -= weight;
}

absl::Status ShardWriterImpl::SyncSegments() {
  absl::MutexLock lock(&io_mu_);
  for (SealedSegment& s : sealed_) {
    if (s.writer != nullptr) RETURN_IF_ERROR(s.writer->Sync());  // a retired one was synced
  }
  if (seg_ != nullptr) RETURN_IF_ERROR(seg_->Sync());
  if (new_files_) {
    RETURN_IF_ERROR(engine_->fs()->SyncDir(
        engine_->CheckpointDir(rec_.spec.job, rec_.spec.step)));
    new_files_ = false;
  }
  return absl::OkStatus();
}

absl::Status ShardWriterImpl::Persist(bool finish) {
  if (finished_) return absl::OkStatus();
  ScopedLatency latency(StorageStats::Get().commit_seconds);
  Dispatch();
  AdvanceTensor();
  WaitIdle();
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(error_);
  }
  ShardRecord next = rec_;
  std::vector<ChunkRecord> chunks;
  {
    absl::MutexLock lock(&mu_);
    chunks = completed_;
    next.tensor_digests = digests_;
  }
  std::sort(chunks.begin(), chunks.end(), [](const ChunkRecord& a, const ChunkRecord& b) {
    return a.header.stream_offset < b.header.stream_offset;
  });
  next.committed_size = written_;
  next.chunk_count += static_cast<uint32_t>(chunks.size());
  for (const ChunkRecord& c : chunks) next.stored_bytes += c.header.record_len();
  absl::Status s;
  if (finish) {
    for (size_t i = 0; i < next.tensor_digests.size(); ++i) {
      if (next.tensor_digests[i].empty()) {
        return absl::InternalError(absl::StrCat("no digest for ",
                                                Where(rec_.spec.job, rec_.spec.step,
                                                      rec_.spec.rank, rec_.spec.tensors[i].name)));
      }
    }
    next.committed = true;
    s = AppendFooter(next, chunks);
  }
  if (s.ok()) s = SyncSegments();
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    if (error_.ok()) error_ = s;
    return s;
  }
  {
    absl::MutexLock lock(&io_mu_);
    NoteSealedLocked(&next.segments);
    if (seg_ != nullptr) NoteSegmentEnd(&next.segments, seg_seq_ - 1, seg_->end());
  }
  s = engine_->CommitShardProgress(next, chunks, finish);
  // A failed commit (a full catalog disk) may be retried with this writer: the segments it
  // sealed stay listed until a commit names them, else the retry would commit a record
  // without them (their chunks unreadable, the files quarantined at the next Open).
  if (!s.ok()) return s;
  {
    absl::MutexLock lock(&io_mu_);
    sealed_.clear();  // named by the record just committed (no roll since: WaitIdle above)
  }
  StorageStats& stats = StorageStats::Get();
  stats.raw_bytes_written->Add(static_cast<int64_t>(written_ - committed_));
  stats.stored_bytes_written->Add(static_cast<int64_t>(next.stored_bytes - rec_.stored_bytes));
  stats.chunks_written->Add(static_cast<int64_t>(chunks.size()));
  for (const ChunkRecord& c : chunks) {
    if (c.header.codec == ChunkCodec::kZstd) stats.chunks_compressed->Add();
  }
  rec_ = std::move(next);
  committed_ = written_;
  absl::MutexLock lock(&mu_);
  completed_.erase(completed_.begin(), completed_.begin() + chunks.size());
  return absl::OkStatus();
}

absl::Status ShardWriterImpl::Finish() {
  if (finished_) return absl::OkStatus();
  if (written_ != total_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Finish with ", written_, " of ", total_, " bytes written for ",
        Where(rec_.spec.job, rec_.spec.step, rec_.spec.rank)));
  }
  RETURN_IF_ERROR(Persist(/*finish=*/true));
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace

size_t MaxShardWriterBufferBytes(const EngineOptions& options) {
  // HasRoom() admits jobs while their buffers (raw and compressed) stay within max_jobs full
  // chunks' worth; one more buffer is being filled.
  const size_t full = AlignUp(MaxRecordSize(options.chunk_bytes));
  return (2 * static_cast<size_t>(MaxJobs(options)) + 1) * full;
}

size_t ShardWriterReservedBuffers(const EngineOptions& options) {
  return static_cast<size_t>(MaxJobs(options)) + 1;
}

absl::StatusOr<std::unique_ptr<ShardWriter>> NewShardWriter(EngineImpl* engine,
                                                            ShardRecord record) {
  auto w = std::make_unique<ShardWriterImpl>(engine, std::move(record));
  RETURN_IF_ERROR(w->Init());
  return std::unique_ptr<ShardWriter>(std::move(w));
}

}  // namespace storage
}  // namespace gradsnap
