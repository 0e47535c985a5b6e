// The remote back end: construction, checkpoint begin/abort and saves (remote_client.h).
#include "client/remote_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/backends.h"
#include "client/remote_placement.h"
#include "client/save_util.h"
#include "proto/convert.h"

namespace gradsnap {
namespace client {
namespace remote {

namespace v1 = ::gradsnap::v1;

RemoteClient::RemoteClient(ClientOptions options, std::vector<std::unique_ptr<Node>> nodes)
    : options_(std::move(options)), nodes_(std::move(nodes)) {
  for (const auto& n : nodes_) endpoints_.push_back(n->endpoint);
  replicas_ = std::min<size_t>(std::max(1, options_.replicas), nodes_.size());
  uint64_t per_save = kPerStreamBytes * replicas_;
  size_t workers = std::clamp<uint64_t>(options_.max_inflight_bytes / per_save, 1, 8);
  saves_ = std::make_unique<SaveQueue>(
      workers, [this](const ShardSpec& spec, const std::vector<TensorRef>& tensors) {
        return SaveShardNow(spec, tensors);
      });
}

// Finishes queued saves before the nodes go.
RemoteClient::~RemoteClient() { saves_.reset(); }

absl::Status RemoteClient::ForAllNodes(const std::function<absl::Status(Node&)>& fn) {
  if (nodes_.size() == 1) return fn(*nodes_[0]);
  std::vector<std::future<absl::Status>> results;
  for (auto& n : nodes_) {
    Node* node = n.get();
    results.push_back(std::async(std::launch::async, [&fn, node] { return fn(*node); }));
  }
  absl::Status first;
  for (auto& r : results) {
    absl::Status s = r.get();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

absl::Status RemoteClient::BeginCheckpoint(const CheckpointSpec& spec) {
  v1::BeginCheckpointRequest req;
  proto::ToProto(spec, req.mutable_spec());
  return ForAllNodes([&](Node& node) {
    v1::BeginCheckpointResponse resp;
    return Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::BeginCheckpointResponse* r) {
      return node.stub()->BeginCheckpoint(ctx, req, r);
    });
  });
}

absl::Status RemoteClient::AbortCheckpoint(const std::string& job, int64_t step) {
  v1::AbortCheckpointRequest req;
  req.set_job(job);
  req.set_step(step);
  return ForAllNodes([&](Node& node) {
    v1::AbortCheckpointResponse resp;
    return Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::AbortCheckpointResponse* r) {
      return node.stub()->AbortCheckpoint(ctx, req, r);
    });
  });
}

absl::StatusOr<uint64_t> RemoteClient::AcquireEpoch(const std::string& job) {
  v1::AcquireEpochRequest req;
  req.set_job(job);
  absl::Mutex mu;
  uint64_t newest = 0;
  RETURN_IF_ERROR(ForAllNodes([&](Node& node) {
    v1::AcquireEpochResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::AcquireEpochResponse* r) {
      return node.stub()->AcquireEpoch(ctx, req, r);
    }));
    absl::MutexLock lock(&mu);
    newest = std::max<uint64_t>(newest, resp.epoch());
    return absl::OkStatus();
  }));
  return newest;
}

std::future<absl::Status> RemoteClient::SaveShardAsync(const ShardSpec& spec,
                                                       std::vector<TensorRef> tensors) {
  absl::StatusOr<ShardSpec> resolved = ResolveShardSpec(spec, tensors);
  if (!resolved.ok()) {
    std::promise<absl::Status> failed;
    failed.set_value(resolved.status());
    return failed.get_future();
  }
  return saves_->Push(*std::move(resolved), std::move(tensors));
}

absl::Status RemoteClient::SaveShardNow(const ShardSpec& spec,
                                        const std::vector<TensorRef>& tensors) {
  std::vector<size_t> order = RankEndpoints(endpoints_, spec.job, spec.rank);
  std::vector<size_t> holders(order.begin(), order.begin() + replicas_);
  std::vector<std::future<absl::Status>> uploads;
  for (size_t i : holders) {
    Node* node = nodes_[i].get();
    uploads.push_back(std::async(std::launch::async, [this, node, &spec, &tensors] {
      return UploadShard(*node, spec, tensors);
    }));
  }
  absl::Status first;
  for (auto& u : uploads) {
    absl::Status s = u.get();
    if (first.ok() && !s.ok()) first = s;
  }
  RETURN_IF_ERROR(first);
  if (holders.size() == nodes_.size()) return absl::OkStatus();
  // The real copies are durable: now the other nodes may count this rank as done.
  ShardSpec placeholder;
  placeholder.job = spec.job;
  placeholder.step = spec.step;
  placeholder.rank = spec.rank;
  placeholder.metadata = kPlaceholder;
  for (size_t k = replicas_; k < order.size(); ++k) {
    RETURN_IF_ERROR(UploadShard(*nodes_[order[k]], placeholder, {}));
  }
  return absl::OkStatus();
}

namespace {

// Copies payload bytes [offset, offset + n) of the concatenated tensors into out.
void Gather(const std::vector<TensorRef>& tensors, const std::vector<uint64_t>& starts,
            uint64_t offset, char* out, size_t n) {
  size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), offset) -
                                 starts.begin()) - 1;
  while (n > 0 && i < tensors.size()) {
    uint64_t in_tensor = offset - starts[i];
    uint64_t avail = tensors[i].spec.byte_length - in_tensor;
    size_t take = static_cast<size_t>(std::min<uint64_t>(avail, n));
    if (take > 0) {
      std::memcpy(out, static_cast<const char*>(tensors[i].data) + in_tensor, take);
    }
    out += take;
    offset += take;
    n -= take;
    ++i;
  }
}

}  // namespace

absl::Status RemoteClient::UploadShard(Node& node, const ShardSpec& spec,
                                       const std::vector<TensorRef>& tensors) {
  std::vector<uint64_t> starts;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    starts.push_back(total);
    total += t.spec.byte_length;
  }
  // Attempts count consecutive failures without progress: a long upload that keeps advancing
  // through several server restarts is not given up on.
  absl::Status s;
  uint64_t progress = 0;
  for (int failures = 0; failures < std::max(1, options_.max_attempts);) {
    if (failures > 0) {
      if (s.code() == absl::StatusCode::kUnavailable) node.OnUnavailable();
      Backoff(options_, failures);
    }
    uint64_t committed = 0;
    s = UploadAttempt(node, spec, tensors, starts, total, &committed);
    if (s.ok() || !IsRetryable(s)) return s;
    if (committed > progress) {
      progress = committed;
      failures = 1;
    } else {
      ++failures;
    }
  }
  return s;
}

absl::Status RemoteClient::UploadAttempt(Node& node, const ShardSpec& spec,
                                         const std::vector<TensorRef>& tensors,
                                         const std::vector<uint64_t>& starts, uint64_t total,
                                         uint64_t* committed) {
  v1::QueryWriteStatusRequest query;
  query.set_job(spec.job);
  query.set_step(spec.step);
  query.set_rank(spec.rank);
  v1::QueryWriteStatusResponse status;
  {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_, options_.rpc_timeout_ms);
    RETURN_IF_ERROR(Annotate(proto::FromGrpc(node.stub()->QueryWriteStatus(&ctx, query, &status)),
                             node.endpoint));
  }
  if (status.complete()) {
    // Committed earlier (a restarted attempt): idempotent for the same content only.
    v1::GetManifestRequest mreq;
    mreq.set_job(spec.job);
    mreq.set_step(spec.step);
    v1::GetManifestResponse mresp;
    RETURN_IF_ERROR(Unary(node, &mresp, [&](grpc::ClientContext* ctx, v1::GetManifestResponse* r) {
      return node.stub()->GetManifest(ctx, mreq, r);
    }));
    ASSIGN_OR_RETURN(Manifest m, proto::FromProto(mresp.manifest()));
    for (const ShardInfo& s : m.shards) {
      if (s.rank == spec.rank && s.committed && !IsPlaceholder(s)) {
        return CheckCommittedContent(spec, s, tensors);
      }
    }
    return absl::OkStatus();
  }
  uint64_t offset = status.committed_size();
  *committed = offset;
  if (offset > total) {
    return absl::FailedPreconditionError(absl::StrCat(
        node.endpoint, ": server holds ", offset, " bytes of a ", total, "-byte shard"));
  }
  grpc::ClientContext ctx;
  // A server that hangs (stopped, wedged) must not hold an upload forever: the stream gets the
  // unary deadline plus the time the remaining bytes take at a floor of 8 MiB/s.
  const uint64_t stream_ms = (total - offset) / ((8u << 20) / 1000);
  PrepareContext(&ctx, options_,
                 static_cast<int>(std::min<uint64_t>(options_.rpc_timeout_ms + stream_ms,
                                                     24ull * 3600 * 1000)));
  v1::WriteResponse resp;
  auto stub = node.stub();  // keeps the channel alive while the stream runs
  std::unique_ptr<grpc::ClientWriter<v1::WriteRequest>> stream = stub->Write(&ctx, &resp);
  v1::WriteRequest msg;
  proto::ToProto(spec, msg.mutable_shard());
  do {
    size_t n = static_cast<size_t>(std::min<uint64_t>(proto::kMaxDataBytes, total - offset));
    msg.set_write_offset(offset);
    std::string* data = msg.mutable_data();
    data->resize(n);
    Gather(tensors, starts, offset, data->data(), n);
    msg.set_finish_write(offset + n == total);
    if (!stream->Write(msg)) break;  // broken stream: Finish() says why
    offset += n;
    msg.clear_shard();
  } while (offset < total);
  stream->WritesDone();
  RETURN_IF_ERROR(Annotate(proto::FromGrpc(stream->Finish()), node.endpoint));
  if (!resp.shard_committed()) {
    return absl::UnavailableError(absl::StrCat(node.endpoint, ": upload ended uncommitted"));
  }
  return absl::OkStatus();
}

}  // namespace remote

absl::StatusOr<std::unique_ptr<Client>> NewRemoteClient(const ClientOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no endpoints");
  ASSIGN_OR_RETURN(auto creds, remote::MakeChannelCredentials(options));
  std::vector<std::unique_ptr<remote::Node>> nodes;
  for (const std::string& e : options.endpoints) {
    if (e.empty() || e.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("endpoint \"", e, "\" is not HOST:PORT"));
    }
    for (const auto& n : nodes) {
      if (n->endpoint == e) return absl::InvalidArgumentError(absl::StrCat("endpoint ", e, " twice"));
    }
    nodes.push_back(remote::MakeNode(e, creds));
  }
  return std::unique_ptr<Client>(new remote::RemoteClient(options, std::move(nodes)));
}

}  // namespace client
}  // namespace gradsnap
