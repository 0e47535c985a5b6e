// The remote back end: restore, listing and administrative calls (remote_client.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/support/byte_buffer.h"
#include "client/remote_client.h"
#include "client/remote_placement.h"
#include "proto/convert.h"

namespace gradsnap {
namespace client {
namespace remote {

namespace v1 = ::gradsnap::v1;

absl::Status RemoteClient::ForAnyNode(const std::function<absl::Status(Node&)>& fn) {
  std::vector<absl::Status> results(nodes_.size());
  if (nodes_.size() == 1) {
    results[0] = fn(*nodes_[0]);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = fn(*nodes_[i]); });
    }
    for (auto& t : threads) t.join();
  }
  absl::Status first;
  for (const auto& s : results) {
    if (s.ok()) return absl::OkStatus();
    // Prefer an answer from a live node over "unavailable".
    if (first.ok() || first.code() == absl::StatusCode::kUnavailable) first = s;
  }
  return first;
}

absl::StatusOr<std::vector<std::string>> RemoteClient::ListJobs() {
  absl::Mutex mu;
  std::set<std::string> jobs;
  RETURN_IF_ERROR(ForAnyNode([&](Node& node) -> absl::Status {
    v1::ListJobsResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::ListJobsResponse* r) {
      return node.stub()->ListJobs(ctx, v1::ListJobsRequest(), r);
    }));
    absl::MutexLock lock(&mu);
    for (const auto& j : resp.jobs()) jobs.insert(j);
    return absl::OkStatus();
  }));
  return std::vector<std::string>(jobs.begin(), jobs.end());
}

absl::StatusOr<std::vector<CheckpointInfo>> RemoteClient::List(const std::string& job,
                                                               bool include_pending) {
  v1::ListCheckpointsRequest req;
  req.set_job(job);
  req.set_include_pending(include_pending);
  absl::Mutex mu;
  std::map<int64_t, CheckpointInfo> merged;
  RETURN_IF_ERROR(ForAnyNode([&](Node& node) -> absl::Status {
    v1::ListCheckpointsResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp,
                          [&](grpc::ClientContext* ctx, v1::ListCheckpointsResponse* r) {
                            return node.stub()->ListCheckpoints(ctx, req, r);
                          }));
    absl::MutexLock lock(&mu);
    for (const auto& c : resp.checkpoints()) {
      ASSIGN_OR_RETURN(CheckpointInfo info, proto::FromProto(c));
      auto [it, inserted] = merged.emplace(info.step, info);
      if (inserted) continue;
      // With placement a node counts only the ranks it holds: keep the largest view, and
      // COMMITTED wins over PENDING.
      if (info.state == CheckpointState::kCommitted) it->second.state = info.state;
      it->second.raw_bytes = std::max(it->second.raw_bytes, info.raw_bytes);
      it->second.stored_bytes = std::max(it->second.stored_bytes, info.stored_bytes);
    }
    return absl::OkStatus();
  }));
  std::vector<CheckpointInfo> out;
  for (auto& [step, info] : merged) out.push_back(std::move(info));
  return out;
}

// The manifest from one node, page by page (docs/protocol.md, "Large manifests"). A page's
// first shard continues the previous page's last one when it has the same rank.
absl::StatusOr<Manifest> RemoteClient::FetchManifest(Node& node, v1::GetManifestRequest req) {
  req.set_paged(true);
  req.set_shard_cursor(0);
  req.set_tensor_cursor(0);
  Manifest out;
  for (int page = 0;; ++page) {
    v1::GetManifestResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::GetManifestResponse* r) {
      return node.stub()->GetManifest(ctx, req, r);
    }));
    ASSIGN_OR_RETURN(Manifest m, proto::FromProto(resp.manifest()));
    if (page == 0) {
      out.info = m.info;
    }
    for (ShardInfo& s : m.shards) {
      if (!out.shards.empty() && out.shards.back().rank == s.rank) {
        ShardInfo& last = out.shards.back();
        if (last.metadata.empty()) last.metadata = std::move(s.metadata);
        for (auto& t : s.tensors) last.tensors.push_back(std::move(t));
      } else {
        out.shards.push_back(std::move(s));
      }
    }
    if (!resp.more()) break;  // also a server that does not page: one whole manifest
    bool advances = resp.next_shard() > req.shard_cursor() ||
                    (resp.next_shard() == req.shard_cursor() &&
                     resp.next_tensor() > req.tensor_cursor());
    if (!advances || page > 1000000) {
      return absl::DataLossError("manifest paging from the server does not advance");
    }
    req.set_shard_cursor(resp.next_shard());
    req.set_tensor_cursor(resp.next_tensor());
  }
  return out;
}

absl::StatusOr<Manifest> RemoteClient::Show(const std::string& job, int64_t step) {
  v1::GetManifestRequest req;
  req.set_job(job);
  req.set_step(step);
  absl::Mutex mu;
  std::vector<Manifest> found;
  RETURN_IF_ERROR(ForAnyNode([&](Node& node) -> absl::Status {
    ASSIGN_OR_RETURN(Manifest m, FetchManifest(node, req));
    absl::MutexLock lock(&mu);
    found.push_back(std::move(m));
    return absl::OkStatus();
  }));
  Manifest out = found[0];
  std::map<int32_t, ShardInfo> shards;
  for (const Manifest& m : found) {
    if (m.info.state == CheckpointState::kCommitted) out.info.state = m.info.state;
    for (const ShardInfo& s : m.shards) {
      if (IsPlaceholder(s)) continue;
      auto [it, inserted] = shards.emplace(s.rank, s);
      if (!inserted && !it->second.committed && s.committed) it->second = s;
    }
  }
  out.shards.clear();
  out.info.raw_bytes = 0;
  out.info.stored_bytes = 0;
  for (auto& [rank, s] : shards) {
    if (s.committed) {
      out.info.raw_bytes += s.raw_bytes;
      out.info.stored_bytes += s.stored_bytes;
    }
    out.shards.push_back(std::move(s));
  }
  return out;
}

namespace {

// Reads protobuf wire format straight out of a ByteBuffer's slices, so a Read message's data
// reaches the sink without being copied into a std::string first.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { Skip0(); }
  bool AtEnd() const { return i_ >= slices_.size(); }
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && !AtEnd(); shift += 7) {
      uint8_t b = slices_[i_].begin()[off_];
      Advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Hands the next n bytes to fn in contiguous pieces; false if fewer remain or fn fails.
  template <typename Fn>
  bool Take(uint64_t n, Fn&& fn) {
    while (n > 0) {
      if (AtEnd()) return false;
      size_t avail = slices_[i_].size() - off_;
      size_t take = static_cast<size_t>(std::min<uint64_t>(avail, n));
      if (!fn(reinterpret_cast<const char*>(slices_[i_].begin()) + off_, take)) return false;
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    off_ += n;
    Skip0();
  }
  void Skip0() {
    while (i_ < slices_.size() && off_ >= slices_[i_].size()) {
      ++i_;
      off_ = 0;
    }
  }
  const std::vector<grpc::Slice>& slices_;
  size_t i_ = 0;
  size_t off_ = 0;
};

// One ReadResponse: the shard info bytes go to on_shard(bytes) as soon as they are read (they
// precede the data: fields are serialized in number order), the data to on_data(offset, p, n)
// piece by piece. DATA_LOSS for malformed wire bytes.
template <typename OnShard, typename OnData>
absl::Status ParseReadResponse(const grpc::ByteBuffer& bb, OnShard&& on_shard, OnData&& on_data) {
  std::vector<grpc::Slice> slices;
  if (!bb.Dump(&slices).ok()) return absl::DataLossError("unreadable Read message");
  SliceCursor c(slices);
  uint64_t offset = 0;
  absl::Status sink_status;
  while (!c.AtEnd()) {
    uint64_t key = 0, v = 0;
    if (!c.ReadVarint(&key)) return absl::DataLossError("malformed Read message");
    const uint64_t field = key >> 3, type = key & 7;
    bool ok = true;
    if (type == 0) {
      ok = c.ReadVarint(&v);
      if (field == 2) offset = v;
    } else if (type == 2) {
      ok = c.ReadVarint(&v);
      if (ok && field == 1) {
        std::string shard_bytes;
        ok = c.Take(v, [&](const char* p, size_t n) { shard_bytes.append(p, n); return true; });
        if (ok) RETURN_IF_ERROR(on_shard(shard_bytes));
      } else if (ok && field == 3) {
        ok = c.Take(v, [&](const char* p, size_t n) {
          sink_status = on_data(offset, p, n);
          offset += n;
          return sink_status.ok();
        });
        if (!sink_status.ok()) return sink_status;
      } else if (ok) {
        ok = c.Take(v, [](const char*, size_t) { return true; });
      }
    } else if (type == 1 || type == 5) {
      ok = c.Take(type == 1 ? 8 : 4, [](const char*, size_t) { return true; });
    } else {
      ok = false;
    }
    if (!ok) return absl::DataLossError("malformed Read message");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RemoteClient::ReadFrom(Node& node, const std::string& job, int64_t step,
                                    int32_t rank, uint64_t* offset, uint64_t end,
                                    const std::function<absl::Status(const void*, size_t)>& sink,
                                    uint64_t* total, const ProgressFn& progress) {
  v1::ReadRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_rank(rank);
  req.set_read_offset(*offset);
  if (end != kToEnd) req.set_read_limit(end - *offset);
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_, 0);
  // The method called with raw ByteBuffer responses (parsed below without copying the data).
  std::shared_ptr<grpc::Channel> channel = node.channel();
  const grpc::internal::RpcMethod method("/gradsnap.v1.Storage/Read",
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                   req));
  grpc::ByteBuffer bb;
  absl::Status status;
  bool first = true;
  while (status.ok() && stream->Read(&bb)) {
    auto on_shard = [&](const std::string& bytes) -> absl::Status {
      if (!first) return absl::OkStatus();  // only the first message's counts
      v1::ShardInfo pinfo;
      if (!pinfo.ParseFromString(bytes)) {
        return absl::DataLossError(absl::StrCat(node.endpoint, ": bad shard info in Read"));
      }
      ASSIGN_OR_RETURN(ShardInfo info, proto::FromProto(pinfo));
      if (IsPlaceholder(info)) {
        return absl::NotFoundError(absl::StrCat(node.endpoint, ": shard is held elsewhere"));
      }
      uint64_t size = 0;
      for (const auto& t : info.tensors) size += t.spec.byte_length;
      *total = size;
      first = false;
      return absl::OkStatus();
    };
    auto on_data = [&](uint64_t at, const char* p, size_t n) -> absl::Status {
      if (first) return absl::DataLossError(absl::StrCat(node.endpoint, ": Read data first"));
      if (at != *offset) {
        return absl::DataLossError(absl::StrCat(node.endpoint, ": Read sent offset ", at,
                                                ", expected ", *offset));
      }
      RETURN_IF_ERROR(sink(p, n));
      *offset += n;
      return absl::OkStatus();
    };
    status = ParseReadResponse(bb, on_shard, on_data);
    if (status.ok() && first) {
      status = absl::DataLossError(absl::StrCat(node.endpoint, ": Read without shard info"));
    }
    if (status.ok() && progress) progress(*offset, end == kToEnd ? *total : end);
  }
  if (!status.ok()) {
    ctx.TryCancel();
    stream->Finish().IgnoreError();
    return status;
  }
  RETURN_IF_ERROR(Annotate(proto::FromGrpc(stream->Finish()), node.endpoint));
  uint64_t want = end == kToEnd ? *total : end;
  if (*offset != want) {
    return absl::UnavailableError(absl::StrCat(node.endpoint, ": Read ended at ", *offset,
                                               " of ", want));
  }
  return absl::OkStatus();
}

absl::Status RemoteClient::ReadRange(const std::string& job, int64_t step, int32_t rank,
                                     uint64_t offset, uint64_t end,
                                     const std::function<absl::Status(const void*, size_t)>& sink,
                                     const ProgressFn& progress) {
  std::vector<size_t> order = RankEndpoints(endpoints_, job, rank);
  absl::Status last = absl::NotFoundError("no node holds the shard");
  uint64_t total = 0;
  for (int failures = 0; failures < std::max(1, options_.max_attempts);) {
    if (failures > 0) Backoff(options_, failures);
    uint64_t before = offset;
    for (size_t i : order) {
      absl::Status s = ReadFrom(*nodes_[i], job, step, rank, &offset, end, sink, &total, progress);
      if (s.ok()) return s;
      if (s.code() == absl::StatusCode::kUnavailable) nodes_[i]->OnUnavailable();
      // Another replica may have it: move on for missing, unavailable or busy nodes.
      if (!IsRetryable(s) && s.code() != absl::StatusCode::kNotFound) return s;
      if (s.code() != absl::StatusCode::kNotFound || last.code() == absl::StatusCode::kNotFound) {
        last = s;
      }
    }
    if (last.code() == absl::StatusCode::kNotFound) return last;
    failures = offset > before ? 1 : failures + 1;
  }
  return last;
}

absl::Status RemoteClient::RestoreShard(const std::string& job, int64_t step, int32_t rank,
                                        const std::function<absl::Status(const void*, size_t)>& sink,
                                        const ProgressFn& progress) {
  return ReadRange(job, step, rank, 0, kToEnd, sink, progress);
}

absl::Status RemoteClient::RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                                         const std::string& tensor, void* out, size_t out_len) {
  ASSIGN_OR_RETURN(Manifest m, Show(job, step));
  for (const ShardInfo& s : m.shards) {
    if (s.rank != rank) continue;
    uint64_t offset = 0;
    for (const storage::TensorInfo& t : s.tensors) {
      if (t.spec.name != tensor) {
        offset += t.spec.byte_length;
        continue;
      }
      if (out_len != t.spec.byte_length) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, " has ",
                                                       t.spec.byte_length, " bytes, buffer ",
                                                       out_len));
      }
      char* dst = static_cast<char*>(out);
      size_t filled = 0;
      auto sink = [&](const void* p, size_t n) -> absl::Status {
        if (n > out_len - filled) return absl::DataLossError("server sent too many bytes");
        std::memcpy(dst + filled, p, n);
        filled += n;
        return absl::OkStatus();
      };
      return ReadRange(job, step, rank, offset, offset + t.spec.byte_length, sink, nullptr);
    }
    return absl::NotFoundError(absl::StrCat("no tensor ", tensor, " in rank ", rank));
  }
  return absl::NotFoundError(absl::StrCat("no rank ", rank, " in ", job, " step ", step));
}

absl::Status RemoteClient::ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                                          uint64_t offset, uint64_t length, void* out) {
  if (length == 0) return absl::OkStatus();
  char* dst = static_cast<char*>(out);
  uint64_t filled = 0;
  auto sink = [&](const void* p, size_t n) -> absl::Status {
    if (n > length - filled) return absl::DataLossError("server sent too many bytes");
    std::memcpy(dst + filled, p, n);
    filled += n;
    return absl::OkStatus();
  };
  // ReadRange resumes a broken stream where it stopped, so `filled` tracks its offset.
  return ReadRange(job, step, rank, offset, offset + length, sink, nullptr);
}

absl::Status RemoteClient::Verify(const std::string& job, int64_t step,
                                  const ProgressFn& progress) {
  v1::VerifyRequest req;
  req.set_job(job);
  req.set_step(step);
  std::atomic<uint64_t> done{0};
  size_t nodes_done = 0;
  absl::Mutex mu;
  absl::Status s = ForAllNodes([&](Node& node) -> absl::Status {
    v1::VerifyResponse resp;
    absl::Status v = Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::VerifyResponse* r) {
      return node.stub()->Verify(ctx, req, r);
    });
    // A node that never saw this checkpoint is fine when another one has it.
    if (v.code() == absl::StatusCode::kNotFound && nodes_.size() > 1) return absl::OkStatus();
    RETURN_IF_ERROR(v);
    done += resp.bytes_verified();
    absl::MutexLock lock(&mu);
    ++nodes_done;
    if (progress) progress(nodes_done, nodes_.size());
    return absl::OkStatus();
  });
  RETURN_IF_ERROR(s);
  if (nodes_done == 0) return absl::NotFoundError(absl::StrCat(job, " step ", step, " not found"));
  return absl::OkStatus();
}

absl::Status RemoteClient::Delete(const std::string& job, int64_t step) {
  v1::DeleteRequest req;
  req.set_job(job);
  req.set_step(step);
  return ForAllNodesTolerant([&](Node& node) {
    v1::DeleteResponse resp;
    return Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::DeleteResponse* r) {
      return node.stub()->Delete(ctx, req, r);
    });
  });
}

absl::StatusOr<GcResult> RemoteClient::Gc(const std::string& job, const GcPolicy& policy) {
  v1::GcRequest req;
  req.set_job(job);
  req.set_keep_last(policy.keep_last);
  req.set_keep_every(policy.keep_every);
  absl::Mutex mu;
  std::set<int64_t> deleted;
  GcResult out;
  RETURN_IF_ERROR(ForAllNodesTolerant([&](Node& node) -> absl::Status {
    v1::GcResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::GcResponse* r) {
      return node.stub()->Gc(ctx, req, r);
    }));
    absl::MutexLock lock(&mu);
    deleted.insert(resp.deleted_steps().begin(), resp.deleted_steps().end());
    out.bytes_reclaimed += resp.bytes_reclaimed();
    return absl::OkStatus();
  }));
  out.deleted_steps.assign(deleted.begin(), deleted.end());
  return out;
}

absl::Status RemoteClient::Health() {
  return ForAllNodes([&](Node& node) -> absl::Status {
    v1::HealthResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::HealthResponse* r) {
      return node.stub()->Health(ctx, v1::HealthRequest(), r);
    }));
    if (!resp.serving()) return absl::UnavailableError(absl::StrCat(node.endpoint, ": stopping"));
    return absl::OkStatus();
  });
}

// Like ForAllNodes, but a node answering NOT_FOUND counts as done when another node succeeds.
absl::Status RemoteClient::ForAllNodesTolerant(const std::function<absl::Status(Node&)>& fn) {
  absl::Mutex mu;
  int ok = 0;
  absl::Status s = ForAllNodes([&](Node& node) -> absl::Status {
    absl::Status r = fn(node);
    if (r.code() == absl::StatusCode::kNotFound && nodes_.size() > 1) return absl::OkStatus();
    if (r.ok()) {
      absl::MutexLock lock(&mu);
      ++ok;
    }
    return r;
  });
  RETURN_IF_ERROR(s);
  if (ok == 0) return absl::NotFoundError("not found on any node");
  return absl::OkStatus();
}

}  // namespace remote
}  // namespace client
}  // namespace gradsnap
