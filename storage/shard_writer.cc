// ShardWriterImpl: cuts a shard's byte stream into chunks, encodes them on a small thread pool,
// hashes each tensor, and appends the records to segment files.
//
// OVERVIEW
//   Append() copies the caller's bytes straight into a record buffer (after the header space)
//   and dispatches a full chunk as a job. A job is encoded on a pool thread (ChunkEncoder,
//   in place unless compression pays), queued on the SegmentWriter (io_uring), and hashed into
//   its tensor's SHA-256 lane. Jobs of one tensor are hashed in order: a job that arrives out
//   of order is parked in its lane and hashed by whichever thread holds the lane, so no thread
//   waits and different tensors hash in parallel. Chunk offsets in the segment follow
//   completion order; the metadata records where each chunk landed.
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
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/footer.h"
#include "storage/segment_writer.h"
#include "storage/storage_stats.h"
#include "storage/task_pool.h"

namespace gradsnap {
namespace storage {
namespace {

struct Job {
  std::unique_ptr<AlignedBuffer> raw;  // record buffer with raw bytes after the header
  std::unique_ptr<AlignedBuffer> alt;  // compressed record, when compression pays
  size_t n = 0;
  uint32_t tensor = 0;
  uint32_t index_in_tensor = 0;
  uint32_t chunk_index = 0;            // in the shard's stream
  uint64_t stream_offset = 0;
  bool try_compress = true;
  ChunkRecord record;
  std::atomic<int> refs{2};            // I/O and hash
  absl::Status status;                 // guarded by the writer's mu_ once shared
};

struct HashLane {
  Sha256 sha;
  uint32_t next = 0;                   // index_in_tensor of the next job to hash
  uint32_t total = UINT32_MAX;         // chunks in the tensor, once the stream passed its end
  std::map<uint32_t, Job*> parked;
  bool busy = false;
  bool done = false;
  std::atomic<int> no_gain{0};         // consecutive chunks that did not compress
};

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
  void StartChunk();
  void Dispatch();
  void AdvanceTensor();
  void Encode(Job* job, ChunkEncoder* enc);
  void SubmitIo(Job* job);
  void Hash(Job* job);
  void Release(Job* job, const absl::Status& s);
  void FinalizeLaneLocked(uint32_t tensor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Persist(bool finish);
  absl::Status OpenSegmentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  absl::Status AppendFooter(const ShardRecord& next, const std::vector<ChunkRecord>& chunks);
  absl::Status SyncSegments();
  void WaitIdle();
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ < max_jobs_; }

  // Constant after construction.
  EngineImpl* const engine_;
  const EngineOptions& opt_;
  const std::string key_;
  std::vector<uint64_t> tensor_end_;  // stream offset where tensor i ends
  uint64_t total_ = 0;
  int max_jobs_ = 1;
  std::atomic<int> io_pending_{0};     // jobs queued on a SegmentWriter, not yet written

  // Caller-thread state.
  ShardRecord rec_;                   // as last persisted
  uint64_t written_ = 0;
  uint64_t committed_ = 0;
  uint32_t tensor_ = 0;               // tensor the stream is in
  uint32_t tensor_chunks_ = 0;        // chunks dispatched for tensor_
  uint32_t next_chunk_index_ = 0;
  std::unique_ptr<AlignedBuffer> cur_;
  size_t cur_len_ = 0;
  uint64_t cur_start_ = 0;
  bool finished_ = false;
  std::vector<std::unique_ptr<HashLane>> lanes_;  // per tensor, created on demand

  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;    // jobs not yet released
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<ChunkRecord> completed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> digests_ ABSL_GUARDED_BY(mu_);  // per tensor, "" until known

  absl::Mutex io_mu_;
  std::unique_ptr<SegmentWriter> seg_ ABSL_GUARDED_BY(io_mu_);
  uint32_t seg_seq_ ABSL_GUARDED_BY(io_mu_) = 0;
  std::vector<std::pair<uint32_t, std::unique_ptr<SegmentWriter>>> sealed_ ABSL_GUARDED_BY(io_mu_);
  bool new_files_ ABSL_GUARDED_BY(io_mu_) = false;

  std::unique_ptr<TaskPool<ChunkEncoder>> pool_;  // last: destroyed (joined) first
};

ShardWriterImpl::ShardWriterImpl(EngineImpl* engine, ShardRecord rec)
    : engine_(engine),
      opt_(engine->options()),
      key_(ShardKey(rec.spec.job, rec.spec.step, rec.spec.rank)),
      rec_(std::move(rec)) {
  for (const TensorSpec& t : rec_.spec.tensors) {
    total_ += t.byte_length;
    tensor_end_.push_back(total_);
  }
  rec_.tensor_sha256.resize(rec_.spec.tensors.size());
  lanes_.resize(rec_.spec.tensors.size());
  written_ = committed_ = rec_.committed_size;
  // Enough chunks to keep the ring full and every encoder busy, and no more (memory).
  max_jobs_ = std::min(opt_.queue_depth, std::max(16, 2 * opt_.encode_threads + 8));
  next_chunk_index_ = rec_.chunk_count;
  finished_ = rec_.committed;  // reopening a committed shard: nothing left to do
  CodecOptions co{opt_.zstd_level, opt_.shuffle, opt_.min_compress_gain};
  pool_ = std::make_unique<TaskPool<ChunkEncoder>>(
      opt_.encode_threads, [co] { return std::make_unique<ChunkEncoder>(co); });
}

ShardWriterImpl::~ShardWriterImpl() {
  WaitIdle();
  pool_.reset();
  engine_->ReleaseWriter(key_);
}

// Waits until every dispatched job has been encoded, written and hashed.
void ShardWriterImpl::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](int* p) { return *p == 0; }, &pending_));
}

absl::Status ShardWriterImpl::Init() {
  {
    absl::MutexLock lock(&mu_);
    digests_ = rec_.tensor_sha256;
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
          (tensor_end_[tensor_] == written_ && !rec_.tensor_sha256[tensor_].empty()))) {
    ++tensor_;
  }
  if (tensor_ < tensor_end_.size()) {
    uint64_t start = tensor_end_[tensor_] - rec_.spec.tensors[tensor_].byte_length;
    if (written_ > start) RETURN_IF_ERROR(ResumeHash(tensor_));
  }
  AdvanceTensor();  // finalizes empty tensors at the current position
  return engine_->fs()->CreateDirs(
      engine_->CheckpointDir(rec_.spec.job, rec_.spec.step));
}

absl::Status ShardWriterImpl::ResumeHash(uint32_t tensor) {
  const ShardSpec& s = rec_.spec;
  ASSIGN_OR_RETURN(std::vector<ChunkRecord> chunks,
                   engine_->LoadChunks(s.job, s.step, s.rank, rec_.chunk_count));
  lanes_[tensor] = std::make_unique<HashLane>();
  HashLane* lane = lanes_[tensor].get();
  std::vector<uint8_t> buf;
  ChunkDecoder dec;
  for (const ChunkRecord& c : chunks) {
    if (c.tensor != tensor) continue;
    buf.resize(c.header.raw_len);
    RETURN_IF_ERROR(ReadChunk(engine_, s.job, s.step, s.rank, s.tensors[tensor].name, c,
                              &dec, buf.data()));
    lane->sha.Update(buf.data(), buf.size());
    ++lane->next;
  }
  tensor_chunks_ = lane->next;
  return absl::OkStatus();
}

void ShardWriterImpl::StartChunk() {
  cur_ = engine_->record_pool()->Get();
  cur_len_ = 0;
  cur_start_ = written_;
}

// Moves tensor_ past every tensor the stream has fully passed, recording each one's chunk
// total in its lane so the lane can finalize its digest.
void ShardWriterImpl::AdvanceTensor() {
  while (tensor_ < tensor_end_.size() && written_ == tensor_end_[tensor_]) {
    if (lanes_[tensor_] == nullptr) lanes_[tensor_] = std::make_unique<HashLane>();
    absl::MutexLock lock(&mu_);
    lanes_[tensor_]->total = tensor_chunks_;
    if (!lanes_[tensor_]->busy) FinalizeLaneLocked(tensor_);
    ++tensor_;
    tensor_chunks_ = 0;
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
    size_t take = std::min(room, n);
    std::memcpy(cur_->data() + kChunkHeaderSize + cur_len_, p, take);
    cur_len_ += take;
    written_ += take;
    p += take;
    n -= take;
    if (cur_len_ == opt_.chunk_bytes || written_ == tensor_end_[tensor_]) Dispatch();
    AdvanceTensor();
  }
  return absl::OkStatus();
}

void ShardWriterImpl::Dispatch() {
  if (cur_ == nullptr || cur_len_ == 0) return;
  auto* job = new Job;
  job->raw = std::move(cur_);
  job->n = cur_len_;
  job->tensor = tensor_;
  job->index_in_tensor = tensor_chunks_++;
  job->chunk_index = next_chunk_index_++;
  job->stream_offset = cur_start_;
  cur_len_ = 0;
  if (lanes_[tensor_] == nullptr) lanes_[tensor_] = std::make_unique<HashLane>();
  HashLane* lane = lanes_[tensor_].get();
  // Adaptive bypass: after two chunks of a tensor that did not compress, only every 8th
  // chunk tries again.
  // Throughput bypass: compress only while the disk is behind (enough writes queued), so
  // encoding time hides behind I/O and compression never lowers throughput.
  bool disk_busy = !opt_.adapt_compression || io_pending_.load() >= max_jobs_ * 3 / 4;
  job->try_compress = opt_.zstd_level > 0 && disk_busy &&
                      (lane->no_gain.load() < 2 || job->index_in_tensor % 8 == 0);
  {
    // Backpressure: at most max_jobs_ chunks (and their buffers) in flight.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &ShardWriterImpl::HasRoom));
    ++pending_;
  }
  pool_->Run([this, job](ChunkEncoder* enc) { Encode(job, enc); });
}

void ShardWriterImpl::Encode(Job* job, ChunkEncoder* enc) {
  const TensorSpec& t = rec_.spec.tensors[job->tensor];
  bool in_alt = false;
  uint8_t* alt = nullptr;
  if (job->try_compress) {
    job->alt = engine_->record_pool()->Get();
    alt = job->alt->data();
  }
  ChunkHeader h = enc->EncodeInPlace(job->raw->data(), job->n, t.dtype, job->stream_offset,
                                     job->try_compress, alt, &in_alt);
  if (job->try_compress) {
    HashLane* lane = lanes_[job->tensor].get();
    if (in_alt) lane->no_gain.store(0); else lane->no_gain.fetch_add(1);
  }
  if (!in_alt && job->alt != nullptr) engine_->record_pool()->Put(std::move(job->alt));
  job->record.header = h;
  job->record.tensor = job->tensor;
  SubmitIo(job);
  Hash(job);
}

void ShardWriterImpl::SubmitIo(Job* job) {
  uint8_t* rec = job->alt != nullptr ? job->alt->data() : job->raw->data();
  size_t len = job->record.header.record_len();
  size_t padded = AlignUp(len);
  std::memset(rec + len, 0, padded - len);
  SegmentWriter* w = nullptr;
  {
    absl::MutexLock lock(&io_mu_);
    if (seg_ == nullptr || (seg_->end() > 0 && seg_->end() + padded > opt_.segment_bytes)) {
      absl::Status created = OpenSegmentLocked();
      if (!created.ok()) {
        Release(job, created);
        return;
      }
    }
    job->record.segment = seg_seq_ - 1;
    w = seg_.get();  // stays alive until Persist(), which first waits for this job
  }
  io_pending_.fetch_add(1);
  w->Append(rec, padded, [this, job](const absl::Status& st, uint64_t offset) {
    io_pending_.fetch_sub(1);
    job->record.offset = offset;
    Release(job, st);
  });
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
  if (seg_ != nullptr) sealed_.emplace_back(seg_seq_ - 1, std::move(seg_));
  seg_ = std::move(created);
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
  ASSIGN_OR_RETURN(f.checkpoint, engine_->LoadCheckpoint(sp.job, sp.step));
  ASSIGN_OR_RETURN(f.chunks, engine_->LoadChunks(sp.job, sp.step, sp.rank, rec_.chunk_count));
  f.chunks.insert(f.chunks.end(), chunks.begin(), chunks.end());
  f.written_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
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
    auto note = [&f](uint32_t s, uint64_t end) {
      for (SegmentRef& r : f.shard.segments) {
        if (r.seq == s) { r.durable_end = end; return; }
      }
      f.shard.segments.push_back(SegmentRef{s, end});
    };
    for (auto& [s, sw] : sealed_) note(s, sw->end());
    note(seq, off);  // placeholder: the size does not depend on the value
    note(seq, off + FooterSize(f));
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

void ShardWriterImpl::Hash(Job* job) {
  const uint32_t tensor = job->tensor;  // `job` may be freed by the Release calls below
  HashLane* lane = lanes_[tensor].get();
  {
    absl::MutexLock lock(&mu_);
    lane->parked[job->index_in_tensor] = job;
    if (lane->busy) return;  // the lane's holder will hash it
    lane->busy = true;
  }
  for (;;) {
    Job* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = lane->parked.find(lane->next);
      if (it == lane->parked.end()) {
        lane->busy = false;
        FinalizeLaneLocked(tensor);
        return;
      }
      next = it->second;
      lane->parked.erase(it);
    }
    lane->sha.Update(next->raw->data() + kChunkHeaderSize, next->n);
    {
      // Finalize before Release: once the last job is released, Persist() may read digests_.
      absl::MutexLock lock(&mu_);
      ++lane->next;
      FinalizeLaneLocked(tensor);
    }
    Release(next, absl::OkStatus());
  }
}

void ShardWriterImpl::FinalizeLaneLocked(uint32_t tensor) {
  HashLane* lane = lanes_[tensor].get();
  if (lane == nullptr || lane->done || lane->next != lane->total) return;
  lane->done = true;
  std::string hex = DigestToHex(lane->sha.Finish());
  const TensorSpec& t = rec_.spec.tensors[tensor];
  if (!t.sha256.empty() && t.sha256 != hex && error_.ok()) {
    error_ = absl::DataLossError(absl::StrCat(
        "SHA-256 mismatch: expected ", t.sha256, ", received bytes hash to ", hex, " for ",
        Where(rec_.spec.job, rec_.spec.step, rec_.spec.rank, t.name)));
  }
  digests_[tensor] = std::move(hex);
}

void ShardWriterImpl::Release(Job* job, const absl::Status& s) {
  bool last = false;
  {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    if (!s.ok()) job->status = s;
    last = job->refs.fetch_sub(1) == 1;
    if (last && job->status.ok()) completed_.push_back(job->record);
  }
  if (!last) return;
  engine_->record_pool()->Put(std::move(job->raw));
  engine_->record_pool()->Put(std::move(job->alt));
  delete job;
  absl::MutexLock lock(&mu_);
  --pending_;
}

absl::Status ShardWriterImpl::SyncSegments() {
  absl::MutexLock lock(&io_mu_);
  for (auto& [seq, w] : sealed_) RETURN_IF_ERROR(w->Sync());
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
    next.tensor_sha256 = digests_;
  }
  std::sort(chunks.begin(), chunks.end(), [](const ChunkRecord& a, const ChunkRecord& b) {
    return a.header.stream_offset < b.header.stream_offset;
  });
  next.committed_size = written_;
  next.chunk_count += static_cast<uint32_t>(chunks.size());
  for (const ChunkRecord& c : chunks) next.stored_bytes += c.header.record_len();
  absl::Status s;
  if (finish) {
    for (size_t i = 0; i < next.tensor_sha256.size(); ++i) {
      if (next.tensor_sha256[i].empty()) {
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
    auto note = [&next](uint32_t seq, uint64_t end) {
      for (SegmentRef& r : next.segments) {
        if (r.seq == seq) { r.durable_end = end; return; }
      }
      next.segments.push_back(SegmentRef{seq, end});
    };
    for (auto& [seq, w] : sealed_) note(seq, w->end());
    if (seg_ != nullptr) note(seg_seq_ - 1, seg_->end());
    sealed_.clear();
  }
  s = engine_->CommitShardProgress(next, chunks, finish);
  if (!s.ok()) return s;
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

absl::StatusOr<std::unique_ptr<ShardWriter>> NewShardWriter(EngineImpl* engine,
                                                            ShardRecord record) {
  auto w = std::make_unique<ShardWriterImpl>(engine, std::move(record));
  RETURN_IF_ERROR(w->Init());
  return std::unique_ptr<ShardWriter>(std::move(w));
}

}  // namespace storage
}  // namespace gradsnap
