// The streaming calls of StorageService: Write (resumable upload) and Read (download), both with
// raw messages so payload bytes are never copied into protobuf strings (storage_service.h,
// "Zero copy").
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/support/method_handler.h"
#include "proto/convert.h"
#include "proto/raw_message.h"
#include "service/storage_service.h"

namespace gradsnap {
namespace service {
// Claims a shard for one writing stream; a second claim fails until the first is released.
// A stream of a newer attempt (a larger writer epoch) cancels the older one holding the shard
// (a zombie rank still uploading) and waits for it to let go.
class StorageService::ActiveShard {
 public:
  ActiveShard(StorageService* service, ShardKey key) : service_(service), key_(std::move(key)) {}
  ~ActiveShard() {
    if (!claimed_) return;
    absl::MutexLock lock(&service_->mu_);
    service_->active_.erase(key_);
  }
  bool Claim(uint64_t epoch, grpc::ServerContext* ctx) {
    constexpr absl::Duration kOlderStreamGrace = absl::Seconds(5);
    const absl::Time give_up = absl::Now() + kOlderStreamGrace;
    absl::MutexLock lock(&service_->mu_);
    for (bool cancelled = false;;) {
      auto [it, inserted] = service_->active_.emplace(key_, ShardWriterCall{epoch, ctx});
      if (inserted) return claimed_ = true;
      if (epoch <= it->second.epoch) return false;  // the same attempt's, or a newer one's
      if (!cancelled) {
        GS_LOG(WARNING) << "shard " << std::get<0>(key_) << "/" << std::get<1>(key_) << "/"
                        << std::get<2>(key_) << ": cancelling the upload of attempt "
                        << it->second.epoch << " for attempt " << epoch;
        it->second.ctx->TryCancel();
        cancelled = true;
      }
      // Its handler flushes (refused as superseded) and lets go of the shard.
      auto released = [this] {
        service_->mu_.AssertHeld();
        return service_->active_.count(key_) == 0;
      };
      if (!service_->mu_.AwaitWithDeadline(absl::Condition(&released), give_up) &&
          service_->active_.count(key_) != 0) {
        return false;
      }
    }
  }

 private:
  StorageService* service_;
  ShardKey key_;
  bool claimed_ = false;
};

// The RAM-tier copy of an upload in the making: a cache reservation and the payload so far.
// Returns the reservation unless Publish() handed it to the cache.
class StorageService::StagedPayload {
 public:
  explicit StagedPayload(ShardCache* cache) : cache_(cache) {}
  ~StagedPayload() {
    if (reserved_ > 0) cache_->Unreserve(reserved_);
  }
  StagedPayload(const StagedPayload&) = delete;
  StagedPayload& operator=(const StagedPayload&) = delete;

  // Stages a shard of `total` bytes of (job, step), whose chain starts at `base` (see
  // ShardCache::Reserve), when the cache can reserve it.
  void Start(const std::string& job, int64_t step, int64_t base, uint64_t total) {
    if (total > 0 && cache_->Reserve(job, step, base, total)) reserved_ = total;
  }
  bool active() const { return reserved_ > 0; }
  void Append(const std::vector<grpc::Slice>& pieces) {
    if (!active()) return;
    for (const grpc::Slice& p : pieces) {
      if (!shard_.Append(p.begin(), p.size(), reserved_)) {
        // No memory for the copy: this upload is simply not cached.
        GS_LOG(WARNING) << "RAM tier: cannot map memory to stage an upload; it is not cached";
        cache_->Unreserve(reserved_);
        reserved_ = 0;
        shard_ = CachedShard();
        return;
      }
    }
  }
  // Hands the payload to the cache (its reservation becomes the entry).
  void Publish(const storage::ShardSpec& spec, const storage::ShardInfo& info) {
    if (!active() || shard_.size != reserved_) return;  // incomplete: the destructor unreserves
    shard_.info = info;
    reserved_ = 0;
    cache_->Publish(spec.job, spec.step, spec.rank, std::move(shard_));
  }

 private:
  ShardCache* const cache_;
  uint64_t reserved_ = 0;
  CachedShard shard_;
};

// One WriteRequest; `data` references the received message's slices.
struct StorageService::WriteMessage {
  bool has_shard = false;
  v1::ShardSpec shard;
  uint64_t write_offset = 0;
  std::vector<grpc::Slice> data;
  uint64_t size = 0;
  bool finish_write = false;
};

StorageService::StorageService(storage::Engine* engine, const Authorizer* auth,
                               InflightLimiter* limiter, InflightLimiter* read_limiter,
                               ShardCache* cache, const StorageServiceOptions& options)
    : engine_(engine),
      auth_(auth),
      limiter_(limiter),
      read_limiter_(read_limiter),
      cache_(cache),
      options_(options),
      metrics_(ServiceMetrics::Get()) {
  // Raw handlers in place of the generated ones: a streamed (bidirectional) method on the
  // server side serves the same client-streaming / server-streaming calls on the wire.
  MarkMethodStreamed(
      proto::method::kWrite,
      new grpc::internal::BidiStreamingHandler<StorageService, grpc::ByteBuffer,
                                               v1::WriteResponse>(
          [](StorageService* s, grpc::ServerContext* ctx, WriteStream* stream) {
            return s->RawWrite(ctx, stream);
          },
          this));
  MarkMethodStreamed(proto::method::kRead,
                     new grpc::internal::SplitServerStreamingHandler<v1::ReadRequest,
                                                                     grpc::ByteBuffer>(
                         [this](grpc::ServerContext* ctx, ReadStream* stream) {
                           return RawRead(ctx, stream);
                         }));
}

grpc::Status StorageService::RawWrite(grpc::ServerContext* ctx, WriteStream* stream) {
  ScopedLatency t(metrics_->write_seconds);
  v1::WriteResponse resp;
  absl::Status s = DoWrite(ctx, stream, &resp);
  // A client-streaming call answers exactly one message on success, none on failure.
  if (s.ok() && !stream->Write(resp)) s = absl::CancelledError("client went away during Write");
  return Done(s);
}

absl::StatusOr<bool> StorageService::NextMessage(WriteStream* stream, WriteMessage* msg,
                                                 IdleWatch::Scope* watch) {
  grpc::ByteBuffer bb;
  if (!watch->WhileWaiting([&] { return stream->Read(&bb); })) return false;
  *msg = WriteMessage();
  RETURN_IF_ERROR(proto::ForEachField(
      bb, "Write message", absl::StatusCode::kInvalidArgument,
      [&](proto::RawField& f) -> absl::Status {
        const bool bytes = f.wire_type == 2;
        switch (f.number) {
          case proto::field::kWriteShard:
            // A message field met twice merges, as protobuf parsers do.
            if (!bytes || !msg->shard.MergeFromString(f.Flatten())) {
              return absl::InvalidArgumentError("malformed shard spec in Write");
            }
            msg->has_shard = true;
            break;
          case proto::field::kWriteOffset:
            if (bytes) return absl::InvalidArgumentError("malformed write_offset in Write");
            msg->write_offset = f.varint;
            break;
          case proto::field::kWriteData:
            if (!bytes) return absl::InvalidArgumentError("malformed data in Write");
            msg->size = f.size;  // a bytes field met twice: the last one wins, as in protobuf
            msg->data = std::move(f.pieces);
            break;
          case proto::field::kWriteFinish:
            if (bytes) return absl::InvalidArgumentError("malformed finish_write in Write");
            msg->finish_write = f.varint != 0;
            break;
          default:
            break;  // unknown fields are ignored, as protobuf does
        }
        return absl::OkStatus();
      }));
  if (msg->size > proto::kMaxDataBytes) {
    return absl::InvalidArgumentError("data over 1 MiB in one message");
  }
  return true;
}

absl::Status StorageService::DoWrite(grpc::ServerContext* ctx, WriteStream* stream,
                                     v1::WriteResponse* resp) {
  if (!serving_) return absl::UnavailableError("server is shutting down");
  RETURN_IF_ERROR(WriteGate());
  RETURN_IF_ERROR(auth_->CheckHasToken(*ctx));  // anonymous callers are refused at once
  IdleWatch::Scope watch(&idle_watch_, ctx);  // a silent stream is cancelled after the limit
  // The budget is reserved only for a caller whose token is the job's: a made-up token, or a
  // stream that never sends its first message, holds none of it. The first message itself is
  // bounded by gRPC's message size limit (proto::kMaxMessageBytes).
  WriteMessage msg;
  ASSIGN_OR_RETURN(bool any, NextMessage(stream, &msg, &watch));
  if (!any) return absl::InvalidArgumentError("empty Write stream");
  if (!msg.has_shard) {
    return absl::InvalidArgumentError("the first Write message must carry the shard spec");
  }
  ASSIGN_OR_RETURN(storage::ShardSpec spec, proto::FromProto(msg.shard));
  RETURN_IF_ERROR(auth_->CheckJob(*ctx, spec.job));
  // A Read sends the shard's info in one message: a shard whose info could not be sent is
  // refused now, not stored unreadable.
  if (const size_t info = proto::ShardInfoBytesBound(spec, options_.digest);
      info > proto::kMaxHeadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", spec.job, " step ", spec.step, " rank ", spec.rank, ": the shard's info (spec, ",
        spec.tensors.size(), " tensors with their digests) takes up to ", info,
        " bytes, more than one message holds (", proto::kMaxHeadBytes,
        "): fewer tensors, shorter names or metadata"));
  }
  InflightReservation reservation;
  if (!reservation.Acquire(limiter_, options_.per_stream_bytes,
                           absl::Milliseconds(options_.busy_wait_ms))) {
    metrics_->busy_rejections->Add();
    return absl::ResourceExhaustedError("server busy: in-flight upload budget used up, retry");
  }
  ActiveShard active(this, ShardKey(spec.job, spec.step, spec.rank));
  if (!active.Claim(spec.epoch, ctx)) {
    return absl::AbortedError("another stream is writing this shard; retry later");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardWriter> writer, engine_->OpenShardWriter(spec));
  if (msg.write_offset > writer->written_size()) {
    return absl::OutOfRangeError(absl::StrCat("write_offset ", msg.write_offset, " is past the ",
                                              writer->written_size(), " bytes received"));
  }
  // Stage the payload for the RAM tier when it streams from the start and fits.
  StagedPayload stage(cache_);
  if (msg.write_offset == 0 && writer->written_size() == 0 && cache_->budget() > 0) {
    stage.Start(spec.job, spec.step, ChainBase(spec.job, spec.step), writer->total_size());
  }
  absl::StatusOr<bool> finish = ReceivePayload(stream, &watch, writer.get(), &msg, &stage);
  if (!finish.ok()) {
    writer->Flush().IgnoreError();  // keep what arrived resumable
    return finish.status();
  }
  if (!*finish) return KeepResumable(ctx, writer.get(), resp);
  return FinishShard(spec, writer.get(), &stage, resp);
}

absl::StatusOr<bool> StorageService::ReceivePayload(WriteStream* stream,
                                                    IdleWatch::Scope* watch,
                                                    storage::ShardWriter* writer,
                                                    WriteMessage* msg, StagedPayload* stage) {
  uint64_t offset = msg->write_offset;
  uint64_t unflushed = 0;
  for (bool first = true;; first = false) {
    if (!first && msg->has_shard) {
      return absl::InvalidArgumentError("only the first Write message may carry the shard");
    }
    if (msg->write_offset != offset) {
      return absl::OutOfRangeError(
          absl::StrCat("write_offset ", msg->write_offset, ", expected ", offset));
    }
    if (msg->size > writer->total_size() - offset) {
      return absl::OutOfRangeError(
          absl::StrCat("data past the shard's ", writer->total_size(), " bytes"));
    }
    RETURN_IF_ERROR(AppendMessage(writer, *msg, &unflushed));
    offset += msg->size;
    metrics_->bytes_in->Add(static_cast<int64_t>(msg->size));
    metrics_->chunks_in->Add();
    stage->Append(msg->data);
    if (unflushed >= options_.flush_bytes) {
      RETURN_IF_ERROR(writer->Flush());
      unflushed = 0;
    }
    if (msg->finish_write) return true;
    ASSIGN_OR_RETURN(bool more, NextMessage(stream, msg, watch));
    if (!more) return false;
  }
}

absl::Status StorageService::AppendMessage(storage::ShardWriter* writer, const WriteMessage& msg,
                                           uint64_t* unflushed) {
  // Skip what the server already has (a resumed stream may overlap).
  const uint64_t have = writer->written_size();
  uint64_t skip = have > msg.write_offset ? have - msg.write_offset : 0;
  for (const grpc::Slice& piece : msg.data) {
    const uint64_t from = std::min<uint64_t>(skip, piece.size());
    skip -= from;
    if (from == piece.size()) continue;
    const size_t n = piece.size() - static_cast<size_t>(from);
    RETURN_IF_ERROR(writer->Append(piece.begin() + from, n));
    *unflushed += n;
  }
  return absl::OkStatus();
}

absl::Status StorageService::KeepResumable(grpc::ServerContext* ctx,
                                           storage::ShardWriter* writer,
                                           v1::WriteResponse* resp) {
  // The client half-closed or vanished: make what arrived durable so it can resume.
  RETURN_IF_ERROR(writer->Flush());
  resp->set_committed_size(writer->committed_size());
  if (ctx->IsCancelled()) return absl::CancelledError("client cancelled the upload");
  return absl::OkStatus();
}

int64_t StorageService::ChainBase(const std::string& job, int64_t step) {
  auto listed = engine_->ListCheckpoints(job, /*include_pending=*/true);
  if (listed.ok()) {
    for (const storage::CheckpointInfo& c : *listed) {
      if (c.step == step && c.kind == storage::CheckpointKind::kDelta) return c.base_step;
    }
  }
  return step;  // a FULL (or not known: its older entries are then evicted first)
}

absl::Status StorageService::FinishShard(const storage::ShardSpec& spec,
                                         storage::ShardWriter* writer, StagedPayload* stage,
                                         v1::WriteResponse* resp) {
  if (writer->written_size() != writer->total_size()) {
    writer->Flush().IgnoreError();
    return absl::OutOfRangeError(absl::StrCat("finish_write at ", writer->written_size(),
                                              " of ", writer->total_size(), " bytes"));
  }
  // A node whose cluster lease lapsed mid-upload commits nothing: what arrived stays
  // resumable for when it holds a lease again.
  if (absl::Status gate = WriteGate(); !gate.ok()) {
    writer->Flush().IgnoreError();
    return gate;
  }
  RETURN_IF_ERROR(writer->Finish());
  metrics_->shard_commits->Add();
  resp->set_committed_size(proto::PayloadSize(spec));
  resp->set_shard_committed(true);
  if (cache_->budget() == 0) {
    // Without a RAM tier only the checkpoint's state is wanted, not its whole manifest (read
    // at every shard's commit, that is quadratic in the ranks: 190 ms a shard at 512 ranks of
    // 1,000 tensors).
    auto listed = engine_->ListCheckpoints(spec.job, /*include_pending=*/true);
    if (!listed.ok()) return absl::OkStatus();  // committed; the flag is information only
    for (const storage::CheckpointInfo& c : *listed) {
      if (c.step != spec.step || c.state != storage::CheckpointState::kCommitted) continue;
      resp->set_checkpoint_committed(true);
      metrics_->checkpoint_commits->Add();
    }
    return absl::OkStatus();
  }
  absl::StatusOr<storage::Manifest> m = engine_->GetManifest(spec.job, spec.step);
  if (!m.ok()) return absl::OkStatus();  // committed; the RAM tier simply misses this shard
  const bool committed = m->info.state == storage::CheckpointState::kCommitted;
  resp->set_checkpoint_committed(committed);
  for (const auto& s : m->shards) {
    if (s.rank == spec.rank) stage->Publish(spec, s);
  }
  if (committed) {
    metrics_->checkpoint_commits->Add();
    const bool delta = m->info.kind == storage::CheckpointKind::kDelta;
    cache_->Committed(spec.job, spec.step, delta ? m->info.base_step : spec.step, &m->shards);
  }
  return absl::OkStatus();
}

grpc::Status StorageService::RawRead(grpc::ServerContext* ctx, ReadStream* stream) {
  ScopedLatency t(metrics_->read_seconds);
  return Done(DoRead(ctx, stream));
}

absl::Status StorageService::DoRead(grpc::ServerContext* ctx, ReadStream* stream) {
  IdleWatch::Scope watch(&idle_watch_, ctx);  // a client that stops taking messages is cancelled
  v1::ReadRequest req;
  if (!watch.WhileWaiting([&] { return stream->Read(&req); })) {
    return absl::InvalidArgumentError("Read without a valid request");
  }
  RETURN_IF_ERROR(Admit(*ctx, req.job(), req.step(), req.rank()));
  Payload cached = cache_->Lookup(req.job(), req.step(), req.rank());
  InflightReservation reservation;  // disk reads hold the engine reader's read-ahead window
  // A ranged read's read-ahead stops at its end (SetReadEnd below): it holds at most its
  // length, a message and a chunk on each side.
  uint64_t reserve = std::min(options_.per_read_bytes, read_limiter_->budget());
  constexpr uint64_t kRangeSlack = proto::kMaxDataBytes + (8u << 20);
  if (req.read_limit() > 0 && req.read_limit() < UINT64_MAX - kRangeSlack) {  // no wrap-around
    reserve = std::min<uint64_t>(reserve, req.read_limit() + kRangeSlack);
  }
  if (cached == nullptr &&
      !reservation.Acquire(read_limiter_, reserve, absl::Milliseconds(options_.busy_wait_ms))) {
    metrics_->busy_rejections->Add();
    return absl::ResourceExhaustedError("server busy: read budget used up, retry");
  }
  std::unique_ptr<storage::ShardReader> reader;
  const storage::ShardInfo* info = nullptr;
  uint64_t total = 0;
  if (cached != nullptr) {
    info = &cached->info;
    total = cached->size;
  } else {
    ASSIGN_OR_RETURN(reader, engine_->OpenShardReader(req.job(), req.step(), req.rank()));
    info = &reader->info();
    for (const auto& t : info->tensors) total += t.spec.byte_length;
  }
  if (req.read_offset() > total) {
    return absl::OutOfRangeError(absl::StrCat("read_offset ", req.read_offset(), " past the ",
                                              total, " bytes of the shard"));
  }
  uint64_t end = total;
  if (req.read_limit() > 0 && req.read_limit() < total - req.read_offset()) {
    end = req.read_offset() + req.read_limit();
  }
  if (reader != nullptr) reader->SetReadEnd(end);  // a ranged read: no read-ahead past it
  return SendPayload(stream, &watch, cached, reader.get(), *info, req.read_offset(), end);
}

// Slices over the reader's decoded chunks for payload bytes [offset, offset + n): one per chunk
// the range touches. Each slice keeps its chunk's memory alive (and out of the reader's reuse)
// until gRPC releases it, so the bytes go from the decoded chunk to the socket uncopied.
absl::Status StorageService::LendChunks(storage::ShardReader* reader,
                                        const storage::ShardInfo& info, uint64_t offset,
                                        size_t n, std::vector<grpc::Slice>* data) {
  for (size_t done = 0; done < n;) {
    const uint8_t* p = nullptr;
    std::shared_ptr<const void> hold;
    ASSIGN_OR_RETURN(size_t got, reader->ReadShared(offset + done, n - done, &p, &hold));
    if (got == 0) {
      return absl::DataLossError(absl::StrCat("shard ended at ", offset + done, " of ",
                                              info.raw_bytes));
    }
    data->push_back(proto::OwnedSlice(const_cast<uint8_t*>(p), got,
                                      [hold = std::move(hold)] { (void)hold; }));
    done += got;
  }
  return absl::OkStatus();
}

absl::Status StorageService::SendPayload(ReadStream* stream, IdleWatch::Scope* watch,
                                         const Payload& cached,
                                         storage::ShardReader* reader,
                                         const storage::ShardInfo& info, uint64_t offset,
                                         uint64_t end) {
  v1::ShardInfo pinfo;
  proto::ToProto(info, &pinfo);
  const std::string info_bytes = pinfo.SerializeAsString();
  if (info_bytes.size() > proto::kMaxHeadBytes) {
    // Written where the wire's bound was not checked (an embedded engine, an older server).
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", info.rank, ": the shard's info takes ", info_bytes.size(),
        " bytes, more than one message holds; restore it from the data directory "
        "(gradsnap --ckpt-dir)"));
  }
  bool first = true;
  do {
    size_t n = static_cast<size_t>(std::min<uint64_t>(proto::kMaxDataBytes, end - offset));
    // The first message: the info and as much data as fits beside it (none beside a large one).
    if (first) n = proto::FirstMessageData(info_bytes.size(), n);
    std::vector<grpc::Slice> data;
    if (cached != nullptr) {
      PayloadSlices(cached, offset, n, &data);
    } else {
      RETURN_IF_ERROR(LendChunks(reader, info, offset, n, &data));
    }
    proto::RawMessageBuilder b;
    if (first) b.AddBytes(proto::field::kReadShard, info_bytes);
    b.AddVarint(proto::field::kReadOffset, offset);
    b.AddSlices(proto::field::kReadData, std::move(data), n);
    // Flow control holds the write while the client takes nothing.
    if (!watch->WhileWaiting([&] { return stream->Write(b.Finish()); })) {
      return absl::CancelledError("client went away during Read");
    }
    offset += n;
    first = false;
    metrics_->bytes_out->Add(static_cast<int64_t>(n));
    metrics_->chunks_out->Add();
  } while (offset < end);
  return absl::OkStatus();
}

}  // namespace service
}  // namespace gradsnap
