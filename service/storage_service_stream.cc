// The streaming calls of StorageService: Write (resumable upload) and Read (download).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/convert.h"
#include "service/storage_service.h"

namespace gradsnap {
namespace service {

// Claims a shard for one writing stream; a second claim fails until the first is released.
class StorageService::ActiveShard {
 public:
  ActiveShard(StorageService* service, ShardKey key) : service_(service), key_(std::move(key)) {}
  ~ActiveShard() {
    if (!claimed_) return;
    absl::MutexLock lock(&service_->mu_);
    service_->active_.erase(key_);
  }
  bool Claim() {
    absl::MutexLock lock(&service_->mu_);
    claimed_ = service_->active_.insert(key_).second;
    return claimed_;
  }

 private:
  StorageService* service_;
  ShardKey key_;
  bool claimed_ = false;
};

grpc::Status StorageService::Write(grpc::ServerContext* ctx,
                                   grpc::ServerReader<v1::WriteRequest>* reader,
                                   v1::WriteResponse* resp) {
  ScopedLatency t(metrics_->write_seconds);
  return Done(DoWrite(ctx, reader, resp));
}

absl::Status StorageService::DoWrite(grpc::ServerContext* ctx,
                                     grpc::ServerReader<v1::WriteRequest>* reader,
                                     v1::WriteResponse* resp) {
  if (!serving_) return absl::UnavailableError("server is shutting down");
  RETURN_IF_ERROR(auth_->CheckHasToken(*ctx));  // anonymous callers get no memory
  InflightReservation reservation;
  if (!reservation.Acquire(limiter_, options_.per_stream_bytes,
                           absl::Milliseconds(options_.busy_wait_ms))) {
    metrics_->busy_rejections->Add();
    return absl::ResourceExhaustedError("server busy: in-flight upload budget used up, retry");
  }
  v1::WriteRequest req;
  if (!reader->Read(&req)) return absl::InvalidArgumentError("empty Write stream");
  if (!req.has_shard()) {
    return absl::InvalidArgumentError("the first Write message must carry the shard spec");
  }
  ASSIGN_OR_RETURN(storage::ShardSpec spec, proto::FromProto(req.shard()));
  RETURN_IF_ERROR(auth_->CheckJob(*ctx, spec.job));
  ActiveShard active(this, ShardKey(spec.job, spec.step, spec.rank));
  if (!active.Claim()) {
    return absl::AbortedError("another stream is writing this shard; retry later");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardWriter> writer, engine_->OpenShardWriter(spec));
  const uint64_t total = writer->total_size();
  uint64_t offset = req.write_offset();
  if (offset > writer->written_size()) {
    return absl::OutOfRangeError(absl::StrCat("write_offset ", offset, " is past the ",
                                              writer->written_size(), " bytes received"));
  }
  // Stage the payload for the RAM tier when it streams from the start and fits.
  CachedShard stage;
  bool staged = offset == 0 && writer->written_size() == 0 && total > 0 &&
                cache_->Reserve(spec.job, spec.step, total);
  auto unstage = [&] {
    if (staged) cache_->Unreserve(total);
    staged = false;
  };

  bool finish = false;
  uint64_t unflushed = 0;
  absl::Status status;
  for (bool first = true;; first = false) {
    if (!first && req.has_shard()) {
      status = absl::InvalidArgumentError("only the first Write message may carry the shard");
      break;
    }
    const std::string& data = req.data();
    if (data.size() > proto::kMaxDataBytes) {
      status = absl::InvalidArgumentError("data over 1 MiB in one message");
      break;
    }
    if (req.write_offset() != offset) {
      status = absl::OutOfRangeError(absl::StrCat("write_offset ", req.write_offset(),
                                                  ", expected ", offset));
      break;
    }
    if (data.size() > total - offset) {
      status = absl::OutOfRangeError(absl::StrCat("data past the shard's ", total, " bytes"));
      break;
    }
    // Skip what the server already has (a resumed stream may overlap).
    uint64_t have = writer->written_size();
    uint64_t skip = have > offset ? std::min<uint64_t>(have - offset, data.size()) : 0;
    if (skip < data.size()) {
      status = writer->Append(data.data() + skip, data.size() - skip);
      if (!status.ok()) break;
      unflushed += data.size() - skip;
    }
    const size_t n = data.size();
    if (staged) stage.Append(std::move(*req.mutable_data()));  // no copy: keep the buffer
    offset += n;
    metrics_->bytes_in->Add(static_cast<int64_t>(n));
    metrics_->chunks_in->Add();
    if (unflushed >= options_.flush_bytes) {
      status = writer->Flush();
      if (!status.ok()) break;
      unflushed = 0;
    }
    if (req.finish_write()) {
      finish = true;
      break;
    }
    if (!reader->Read(&req)) break;
  }
  if (!status.ok()) {
    unstage();
    writer->Flush().IgnoreError();  // keep what arrived resumable
    return status;
  }
  if (!finish) {
    // The client half-closed or vanished: make what arrived durable so it can resume.
    unstage();
    RETURN_IF_ERROR(writer->Flush());
    resp->set_committed_size(writer->committed_size());
    if (ctx->IsCancelled()) return absl::CancelledError("client cancelled the upload");
    return absl::OkStatus();
  }
  if (writer->written_size() != total) {
    unstage();
    writer->Flush().IgnoreError();
    return absl::OutOfRangeError(absl::StrCat("finish_write at ", writer->written_size(),
                                              " of ", total, " bytes"));
  }
  absl::Status fin = writer->Finish();
  if (!fin.ok()) {
    unstage();
    return fin;
  }
  AfterShardCommit(spec, &stage, staged, resp);
  return absl::OkStatus();
}

void StorageService::AfterShardCommit(const storage::ShardSpec& spec, CachedShard* stage,
                                      bool staged, v1::WriteResponse* resp) {
  metrics_->shard_commits->Add();
  resp->set_committed_size(proto::PayloadSize(spec));
  resp->set_shard_committed(true);
  absl::StatusOr<storage::Manifest> m = engine_->GetManifest(spec.job, spec.step);
  if (!m.ok()) {
    if (staged) cache_->Unreserve(stage->size);
    return;
  }
  bool committed = m->info.state == storage::CheckpointState::kCommitted;
  resp->set_checkpoint_committed(committed);
  if (staged) {
    for (const auto& s : m->shards) {
      if (s.rank == spec.rank) stage->info = s;
    }
    cache_->Publish(spec.job, spec.step, spec.rank, std::move(*stage));
  }
  if (committed) {
    metrics_->checkpoint_commits->Add();
    cache_->Committed(spec.job, spec.step);
  }
}

grpc::Status StorageService::Read(grpc::ServerContext* ctx, const v1::ReadRequest* req,
                                  grpc::ServerWriter<v1::ReadResponse>* writer) {
  ScopedLatency t(metrics_->read_seconds);
  return Done(DoRead(ctx, *req, writer));
}

absl::Status StorageService::DoRead(grpc::ServerContext* ctx, const v1::ReadRequest& req,
                                    grpc::ServerWriter<v1::ReadResponse>* writer) {
  RETURN_IF_ERROR(proto::ValidateJob(req.job()));
  RETURN_IF_ERROR(proto::ValidateStep(req.step()));
  RETURN_IF_ERROR(proto::ValidateRank(req.rank()));
  RETURN_IF_ERROR(auth_->CheckJob(*ctx, req.job()));
  Payload cached = cache_->Lookup(req.job(), req.step(), req.rank());
  InflightReservation reservation;  // disk reads hold the engine reader's read-ahead window
  // A ranged read's read-ahead stops at its end (SetReadEnd below): it holds at most its
  // length, a message and a chunk on each side.
  uint64_t reserve = std::min(options_.per_read_bytes, read_limiter_->budget());
  if (req.read_limit() > 0) {
    reserve = std::min<uint64_t>(reserve, req.read_limit() + proto::kMaxDataBytes + (8u << 20));
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
  v1::ReadResponse resp;
  proto::ToProto(*info, resp.mutable_shard());
  uint64_t offset = req.read_offset();
  do {
    size_t n = static_cast<size_t>(std::min<uint64_t>(proto::kMaxDataBytes, end - offset));
    std::string* data = resp.mutable_data();
    if (cached != nullptr) {
      data->resize(n);
      cached->CopyOut(offset, data->data(), n);
    } else {
      data->resize(n);
      ASSIGN_OR_RETURN(size_t got, reader->Read(offset, data->data(), n));
      if (got != n) {
        return absl::DataLossError(absl::StrCat("shard ended at ", offset + got, " of ", total));
      }
    }
    resp.set_offset(offset);
    if (!writer->Write(resp)) return absl::CancelledError("client went away during Read");
    offset += n;
    metrics_->bytes_out->Add(static_cast<int64_t>(n));
    metrics_->chunks_out->Add();
    resp.clear_shard();
  } while (offset < end);
  return absl::OkStatus();
}

}  // namespace service
}  // namespace gradsnap
