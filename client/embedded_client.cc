// The Client interface over an in-process storage engine (the trainer's --ckpt-dir mode).
//
// OVERVIEW
//   Every call maps onto storage::Engine. Saves run on a small pool of worker threads; each
//   streams the caller's tensor memory straight into a ShardWriter (no copy in the client), so
//   the bytes in flight are the shards being written, bounded by ClientOptions.max_inflight_bytes
//   through a ByteBudget. The engine commits the checkpoint when the last shard finishes.
//
// THREAD SAFETY
//   Thread-safe. The destructor waits for every queued save, then closes the engine.
#include <algorithm>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/backends.h"
#include "client/save_util.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine.h"

namespace gradsnap {
namespace client {
namespace {

constexpr int kSaveThreads = 4;
// Appends are cut to this size so the engine never has to take one huge buffer at once.
constexpr size_t kAppendBytes = 8u << 20;
// Most bytes handed to a RestoreShard sink at once (at most a chunk: it sees the chunk itself).
constexpr size_t kReadBytes = 4u << 20;

class EmbeddedClient : public Client {
 public:
  EmbeddedClient(std::unique_ptr<storage::Engine> engine, uint64_t max_inflight_bytes)
      : engine_(std::move(engine)), budget_(max_inflight_bytes) {
    saves_ = std::make_unique<SaveQueue>(
        kSaveThreads, [this](const ShardSpec& spec, const std::vector<TensorRef>& tensors) {
          uint64_t bytes = ShardBytes(spec);
          budget_.Acquire(bytes);
          absl::Status st = WriteShard(spec, tensors);
          budget_.Release(bytes);
          return st;
        });
  }

  // Finishes queued saves before the engine goes.
  ~EmbeddedClient() override { saves_.reset(); }

  const ByteBudget& budget() const { return budget_; }

  absl::Status BeginCheckpoint(const CheckpointSpec& spec) override {
    DropReaders();
    return engine_->BeginCheckpoint(spec);
  }

  std::future<absl::Status> SaveShardAsync(const ShardSpec& spec,
                                           std::vector<TensorRef> tensors) override;

  absl::Status AbortCheckpoint(const std::string& job, int64_t step,
                               uint64_t epoch = 0) override {
    DropReaders();
    return engine_->AbortCheckpoint(job, step, epoch);
  }
  absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) override {
    return engine_->AcquireEpoch(job);
  }
  absl::StatusOr<std::vector<std::string>> ListJobs() override { return engine_->ListJobs(); }
  absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job,
                                                   bool include_pending) override {
    return engine_->ListCheckpoints(job, include_pending);
  }
  absl::StatusOr<Manifest> Show(const std::string& job, int64_t step) override {
    return engine_->GetManifest(job, step);
  }
  absl::Status RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                             const std::string& tensor, void* out, size_t out_len) override;
  absl::Status RestoreShard(const std::string& job, int64_t step, int32_t rank,
                            const std::function<absl::Status(const void*, size_t)>& sink,
                            const ProgressFn& progress) override;
  absl::Status RestoreShardLent(const std::string& job, int64_t step, int32_t rank,
                                const LentSink& sink, const ProgressFn& progress) override;
  absl::Status ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                              uint64_t offset, uint64_t length, void* out) override;
  absl::Status Verify(const std::string& job, int64_t step, const ProgressFn& progress) override;
  absl::Status Delete(const std::string& job, int64_t step, uint64_t epoch) override {
    DropReaders();
    return engine_->Delete(job, step, epoch);
  }
  absl::StatusOr<GcResult> Gc(const std::string& job, const GcPolicy& policy,
                              uint64_t epoch) override {
    DropReaders();
    return engine_->Gc(job, policy, epoch);
  }
  absl::Status Health() override { return absl::OkStatus(); }
  absl::Status HealthNotes(std::vector<std::string>* notes) override {
    const std::string note = engine_->WriteSpace().Note();
    if (!note.empty()) notes->push_back(note);
    return absl::OkStatus();
  }

 private:
  struct CachedReader {
    std::string job;
    int64_t step;
    int32_t rank;
    std::unique_ptr<storage::ShardReader> reader;
  };

  absl::Status WriteShard(const ShardSpec& spec, const std::vector<TensorRef>& tensors);
  // The reader of the shard restored last, so restoring a shard tensor by tensor opens it once
  // and its read-ahead (up to 128 MiB in the engine) serves the next tensor instead of being
  // thrown away. A reader is taken out of the cache while in use (one thread at a time) and put
  // back afterwards. Saves, begins, deletes, GC and aborts drop it, so its memory is not held
  // once training moves on.
  // Deletions bump the generation; a reader taken before one is not put back.
  absl::StatusOr<std::unique_ptr<storage::ShardReader>> TakeReader(const std::string& job,
                                                                   int64_t step, int32_t rank,
                                                                   uint64_t* generation);
  void PutReader(const std::string& job, int64_t step, int32_t rank, uint64_t generation,
                 std::unique_ptr<storage::ShardReader> reader);
  void DropReaders();

  // Constant after construction.
  std::unique_ptr<storage::Engine> engine_;
  ByteBudget budget_;
  std::unique_ptr<SaveQueue> saves_;

  absl::Mutex cache_mu_;
  std::deque<CachedReader> readers_ ABSL_GUARDED_BY(cache_mu_);  // newest last
  uint64_t generation_ ABSL_GUARDED_BY(cache_mu_) = 0;
};

constexpr size_t kCachedReaders = 1;

absl::StatusOr<std::unique_ptr<storage::ShardReader>> EmbeddedClient::TakeReader(
    const std::string& job, int64_t step, int32_t rank, uint64_t* generation) {
  {
    absl::MutexLock lock(&cache_mu_);
    *generation = generation_;
    for (auto it = readers_.begin(); it != readers_.end(); ++it) {
      if (it->job == job && it->step == step && it->rank == rank) {
        std::unique_ptr<storage::ShardReader> r = std::move(it->reader);
        readers_.erase(it);
        return r;
      }
    }
  }
  return engine_->OpenShardReader(job, step, rank);
}

void EmbeddedClient::PutReader(const std::string& job, int64_t step, int32_t rank,
                               uint64_t generation, std::unique_ptr<storage::ShardReader> reader) {
  absl::MutexLock lock(&cache_mu_);
  if (generation != generation_) return;
  readers_.push_back(CachedReader{job, step, rank, std::move(reader)});
  if (readers_.size() > kCachedReaders) readers_.pop_front();
}

void EmbeddedClient::DropReaders() {
  std::deque<CachedReader> old;
  {
    absl::MutexLock lock(&cache_mu_);
    old.swap(readers_);
    ++generation_;
  }
}

std::future<absl::Status> EmbeddedClient::SaveShardAsync(const ShardSpec& spec,
                                                         std::vector<TensorRef> tensors) {
  DropReaders();
  return saves_->Push(spec, std::move(tensors));
}

absl::Status EmbeddedClient::WriteShard(const ShardSpec& spec,
                                        const std::vector<TensorRef>& tensors) {
  ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardWriter> writer, engine_->OpenShardWriter(spec));
  if (writer->committed_size() == writer->total_size()) {
    // Maybe committed by an earlier attempt: idempotent only for the same content.
    absl::StatusOr<Manifest> m = engine_->GetManifest(spec.job, spec.step);
    if (m.ok()) {
      for (const ShardInfo& s : m->shards) {
        if (s.rank == spec.rank && s.committed) {
          RETURN_IF_ERROR(CheckCommittedContent(spec, s, tensors));
        }
      }
    }
  }
  // A resumed writer already holds committed_size() bytes: skip them.
  uint64_t skip = writer->written_size();
  for (const TensorRef& t : tensors) {
    const char* p = static_cast<const char*>(t.data);
    uint64_t len = t.spec.byte_length;
    uint64_t from = std::min(skip, len);
    skip -= from;
    for (uint64_t off = from; off < len;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kAppendBytes, len - off));
      RETURN_IF_ERROR(writer->Append(p + off, n));
      off += n;
    }
  }
  return writer->Finish();
}

absl::Status EmbeddedClient::RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                                           const std::string& tensor, void* out,
                                           size_t out_len) {
  uint64_t generation = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                   TakeReader(job, step, rank, &generation));
  const std::vector<storage::TensorInfo>& ts = reader->info().tensors;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].spec.name != tensor) continue;
    absl::Status st = reader->ReadTensor(i, out, out_len);
    // A reader that failed is not reused: the next attempt re-reads from scratch.
    if (st.ok()) PutReader(job, step, rank, generation, std::move(reader));
    return st;
  }
  PutReader(job, step, rank, generation, std::move(reader));
  return absl::NotFoundError(
      absl::StrCat("no tensor ", tensor, " in job ", job, " step ", step, " rank ", rank));
}

// The sink sees the reader's verified chunk itself: no copy on the way (an export copies it
// once into its file buffers, or on tmpfs lends it to its writer).
absl::Status EmbeddedClient::RestoreShard(
    const std::string& job, int64_t step, int32_t rank,
    const std::function<absl::Status(const void*, size_t)>& sink, const ProgressFn& progress) {
  return RestoreShardLent(
      job, step, rank,
      [&](const void* data, size_t n, std::shared_ptr<const void>) { return sink(data, n); },
      progress);
}

absl::Status EmbeddedClient::RestoreShardLent(const std::string& job, int64_t step,
                                              int32_t rank, const LentSink& sink,
                                              const ProgressFn& progress) {
  ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                   engine_->OpenShardReader(job, step, rank));
  const uint64_t total = reader->info().raw_bytes;
  uint64_t offset = 0;
  while (offset < total) {
    // Held for as long as the sink keeps `hold` (RestoreShard's sink lets go at once).
    const uint8_t* data = nullptr;
    std::shared_ptr<const void> hold;
    ASSIGN_OR_RETURN(size_t n, reader->ReadShared(offset, kReadBytes, &data, &hold));
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("job ", job, " step ", step, " rank ", rank,
                                              ": payload ends at ", offset, " of ", total));
    }
    RETURN_IF_ERROR(sink(data, n, std::move(hold)));
    offset += n;
    if (progress) progress(offset, total);
  }
  return absl::OkStatus();
}

absl::Status EmbeddedClient::ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                                            uint64_t offset, uint64_t length, void* out) {
  // A reader of its own: ranges of one shard are read concurrently by restoring ranks.
  ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                   engine_->OpenShardReader(job, step, rank));
  const uint64_t total = reader->info().raw_bytes;
  if (offset > total || length > total - offset) {
    return absl::OutOfRangeError(absl::StrCat("job ", job, " step ", step, " rank ", rank,
                                              ": bytes [", offset, ", ", offset + length,
                                              ") past the payload of ", total));
  }
  reader->SetReadEnd(offset + length);
  char* dst = static_cast<char*>(out);
  for (uint64_t done = 0; done < length;) {
    ASSIGN_OR_RETURN(size_t n, reader->Read(offset + done, dst + done,
                                            static_cast<size_t>(length - done)));
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("job ", job, " step ", step, " rank ", rank,
                                              ": payload ends at ", offset + done));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status EmbeddedClient::Verify(const std::string& job, int64_t step,
                                    const ProgressFn& progress) {
  if (!progress) return engine_->Verify(job, step);
  // With a progress callback: stream every shard, which checks every chunk checksum and every
  // tensor digest just as Engine::Verify does, and report bytes as they pass.
  ASSIGN_OR_RETURN(Manifest m, engine_->GetManifest(job, step));
  if (m.info.state != CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job, " step ", step, " is not committed"));
  }
  uint64_t total = 0;
  for (const storage::ShardInfo& s : m.shards) total += s.raw_bytes;
  uint64_t base = 0;
  for (const storage::ShardInfo& s : m.shards) {
    auto discard = [](const void*, size_t) { return absl::OkStatus(); };
    auto shard_progress = [&](uint64_t done, uint64_t) { progress(base + done, total); };
    RETURN_IF_ERROR(RestoreShard(job, step, s.rank, discard, shard_progress));
    base += s.raw_bytes;
  }
  if (static_cast<int32_t>(m.shards.size()) != m.info.world_size) {
    return absl::DataLossError(absl::StrCat("job ", job, " step ", step, ": ", m.shards.size(),
                                            " shards for world size ", m.info.world_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> NewEmbeddedClient(const ClientOptions& options) {
  storage::EngineOptions eo;
  eo.data_dir = options.local_dir;
  eo.read_only = options.read_only;
  eo.prefault_writers = options.prefault_writers;
  eo.clock = options.clock;
  ASSIGN_OR_RETURN(std::unique_ptr<storage::Engine> engine, storage::Engine::Open(eo));
  return std::unique_ptr<Client>(
      new EmbeddedClient(std::move(engine), options.max_inflight_bytes));
}

const ByteBudget* EmbeddedSaveBudget(const Client& client) {
  const auto* embedded = dynamic_cast<const EmbeddedClient*>(&client);
  return embedded == nullptr ? nullptr : &embedded->budget();
}

}  // namespace client
}  // namespace gradsnap
