// Unary calls of StorageService; the streams are in storage_service_stream.cc.
#include "service/storage_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "proto/convert.h"

namespace gradsnap {
namespace service {

grpc::Status StorageService::Done(const absl::Status& s) {
  if (!s.ok()) metrics_->Error(static_cast<int>(s.code()));
  return proto::ToGrpc(s);
}

absl::Status StorageService::Admit(const grpc::ServerContext& ctx, const std::string& job) {
  RETURN_IF_ERROR(proto::ValidateJob(job));
  return auth_->CheckJob(ctx, job);
}

absl::Status StorageService::Admit(const grpc::ServerContext& ctx, const std::string& job,
                                   int64_t step) {
  RETURN_IF_ERROR(proto::ValidateStep(step));
  return Admit(ctx, job);
}

absl::Status StorageService::Admit(const grpc::ServerContext& ctx, const std::string& job,
                                   int64_t step, int32_t rank) {
  RETURN_IF_ERROR(proto::ValidateRank(rank));
  return Admit(ctx, job, step);
}

grpc::Status StorageService::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                    v1::HealthResponse* resp) {
  resp->set_version("gradsnap-server 0.1.0");
  resp->set_auth_required(auth_->enabled());
  resp->set_serving(serving_.load());
  const storage::WriteSpaceState space = engine_->WriteSpace();
  metrics_->SetWriteSpace(space);
  resp->set_writes_refused_low_space(space.writes_refused);
  resp->set_free_bytes(space.free_bytes);
  resp->set_reserve_bytes(space.reserve_bytes);
  resp->set_restart_needed(space.restart_needed);
  resp->set_node_id(options_.node_id);
  return grpc::Status::OK;
}

grpc::Status StorageService::BeginCheckpoint(grpc::ServerContext* ctx,
                                             const v1::BeginCheckpointRequest* req,
                                             v1::BeginCheckpointResponse*) {
  return Unary([&]() -> absl::Status {
    if (!serving_) return absl::UnavailableError("server is shutting down");
    RETURN_IF_ERROR(WriteGate());
    ASSIGN_OR_RETURN(storage::CheckpointSpec spec, proto::FromProto(req->spec()));
    RETURN_IF_ERROR(auth_->CheckJob(*ctx, spec.job));
    return engine_->BeginCheckpoint(spec);
  });
}

grpc::Status StorageService::AbortCheckpoint(grpc::ServerContext* ctx,
                                             const v1::AbortCheckpointRequest* req,
                                             v1::AbortCheckpointResponse*) {
  return Unary([&]() -> absl::Status {
    RETURN_IF_ERROR(Admit(*ctx, req->job(), req->step()));
    // Aborting a PENDING FULL also aborts its PENDING DELTAs: their staged shards leave the
    // RAM tier too.
    std::vector<int64_t> dropped = {req->step()};
    auto pending = engine_->ListCheckpoints(req->job(), /*include_pending=*/true);
    if (pending.ok()) {
      for (const auto& c : *pending) {
        if (c.kind == storage::CheckpointKind::kDelta && c.base_step == req->step()) {
          dropped.push_back(c.step);
        }
      }
    }
    // Dropped whatever the engine answers: an abort that fails part-way (a writer still open
    // on the FULL) may have deleted the DELTAs already.
    absl::Status aborted = engine_->AbortCheckpoint(req->job(), req->step(), req->epoch());
    for (int64_t step : dropped) cache_->Drop(req->job(), step);
    return aborted;
  });
}

grpc::Status StorageService::PullCopy(grpc::ServerContext* ctx, const v1::PullCopyRequest* req,
                                      v1::PullCopyResponse* resp) {
  return Unary([&]() -> absl::Status {
    if (!serving_) return absl::UnavailableError("server is shutting down");
    RETURN_IF_ERROR(WriteGate());
    RETURN_IF_ERROR(Admit(*ctx, req->job(), req->step()));  // the job's token, as for a write
    if (!options_.pull_copy) {
      return absl::UnimplementedError("PullCopy needs cluster mode (--etcd) on this node");
    }
    ASSIGN_OR_RETURN(uint64_t bytes,
                     options_.pull_copy(*req, [ctx] { return ctx->IsCancelled(); }));
    resp->set_bytes(bytes);
    return absl::OkStatus();
  });
}

grpc::Status StorageService::AcquireEpoch(grpc::ServerContext* ctx,
                                          const v1::AcquireEpochRequest* req,
                                          v1::AcquireEpochResponse* resp) {
  return Unary([&]() -> absl::Status {
    if (!serving_) return absl::UnavailableError("server is shutting down");
    RETURN_IF_ERROR(WriteGate());
    RETURN_IF_ERROR(Admit(*ctx, req->job()));
    ASSIGN_OR_RETURN(uint64_t epoch, req->raise_to() == 0
                                         ? engine_->AcquireEpoch(req->job())
                                         : engine_->RaiseEpoch(req->job(), req->raise_to()));
    resp->set_epoch(epoch);
    return absl::OkStatus();
  });
}

grpc::Status StorageService::QueryWriteStatus(grpc::ServerContext* ctx,
                                              const v1::QueryWriteStatusRequest* req,
                                              v1::QueryWriteStatusResponse* resp) {
  return Unary([&]() -> absl::Status {
    RETURN_IF_ERROR(Admit(*ctx, req->job(), req->step(), req->rank()));
    ASSIGN_OR_RETURN(storage::Manifest m, engine_->GetManifest(req->job(), req->step()));
    for (const auto& shard : m.shards) {
      if (shard.rank == req->rank() && shard.committed) {
        // "complete" makes the client count the shard saved: only while it reads back (a
        // damaged copy is DATA_LOSS, naming the remedy; storage::Engine::ShardCommittedSize).
        RETURN_IF_ERROR(engine_->ShardCommittedSize(req->job(), req->step(), req->rank(),
                                                    req->epoch())
                            .status());
        resp->set_committed_size(shard.raw_bytes);
        resp->set_complete(true);
        return absl::OkStatus();
      }
    }
    ASSIGN_OR_RETURN(uint64_t size,
                     engine_->ShardCommittedSize(req->job(), req->step(), req->rank(),
                                                 req->epoch()));
    resp->set_committed_size(size);
    return absl::OkStatus();
  });
}

grpc::Status StorageService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* resp) {
  return Unary([&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<std::string> jobs, engine_->ListJobs());
    ASSIGN_OR_RETURN(jobs, auth_->FilterJobs(*ctx, std::move(jobs)));
    for (auto& j : jobs) resp->add_jobs(std::move(j));
    return absl::OkStatus();
  });
}

grpc::Status StorageService::ListCheckpoints(grpc::ServerContext* ctx,
                                             const v1::ListCheckpointsRequest* req,
                                             v1::ListCheckpointsResponse* resp) {
  return Unary([&]() -> absl::Status {
    RETURN_IF_ERROR(Admit(*ctx, req->job()));
    ASSIGN_OR_RETURN(std::vector<storage::CheckpointInfo> list,
                     engine_->ListCheckpoints(req->job(), req->include_pending()));
    for (const auto& c : list) proto::ToProto(c, resp->add_checkpoints());
    return absl::OkStatus();
  });
}

// One page of a manifest (docs/protocol.md, "Large manifests"): tensors from the cursors on,
// until the response reaches kPageBytes; at least one tensor, so every page advances.
absl::Status StorageService::ManifestPage(const storage::Manifest& m,
                                          const v1::GetManifestRequest& req,
                                          v1::GetManifestResponse* resp) {
  constexpr size_t kPageBytes = proto::kMaxMessageBytes - (512u << 10);
  size_t si = req.shard_cursor();
  uint64_t ti = req.tensor_cursor();
  if (si > m.shards.size() || (si < m.shards.size() && ti > m.shards[si].tensors.size()) ||
      (si == m.shards.size() && ti != 0)) {
    return absl::InvalidArgumentError("manifest page cursor outside the manifest");
  }
  v1::Manifest* out = resp->mutable_manifest();
  proto::ToProto(m.info, out->mutable_info());
  size_t bytes = resp->ByteSizeLong();
  bool any = false;
  for (; si < m.shards.size(); ++si, ti = 0) {
    const storage::ShardInfo& s = m.shards[si];
    // A shard's metadata (up to 1 MiB) goes with its first tensor: the page ends before a
    // shard whose metadata would take it past the limit (a shard without tensors too).
    if (any && ti == 0 && bytes + 16 + s.metadata.size() > kPageBytes) {
      resp->set_more(true);
      resp->set_next_shard(static_cast<uint32_t>(si));
      resp->set_next_tensor(0);
      return absl::OkStatus();
    }
    v1::ShardInfo* ps = out->add_shards();
    ps->set_rank(s.rank);
    ps->set_committed(s.committed);
    ps->set_raw_bytes(s.raw_bytes);
    ps->set_stored_bytes(s.stored_bytes);
    ps->set_digest_algorithm(static_cast<v1::DigestAlgorithm>(s.digest_algo));
    if (ti == 0) ps->set_metadata(s.metadata);
    bytes += 16 + s.metadata.size();
    for (; ti < s.tensors.size(); ++ti) {
      if (any && bytes > kPageBytes) {
        resp->set_more(true);
        resp->set_next_shard(static_cast<uint32_t>(si));
        resp->set_next_tensor(ti);
        return absl::OkStatus();
      }
      v1::TensorInfo* t = ps->add_tensors();
      proto::ToProto(s.tensors[ti], t);
      bytes += t->ByteSizeLong() + 8;
      any = true;
    }
  }
  return absl::OkStatus();
}

grpc::Status StorageService::GetManifest(grpc::ServerContext* ctx,
                                         const v1::GetManifestRequest* req,
                                         v1::GetManifestResponse* resp) {
  return Unary([&]() -> absl::Status {
    RETURN_IF_ERROR(Admit(*ctx, req->job(), req->step()));
    ASSIGN_OR_RETURN(storage::Manifest m, engine_->GetManifest(req->job(), req->step()));
    if (req->paged()) return ManifestPage(m, *req, resp);
    proto::ToProto(m, resp->mutable_manifest());
    if (resp->ByteSizeLong() > proto::kMaxMessageBytes) {
      return absl::ResourceExhaustedError(
          "manifest larger than the 4 MiB message limit (ask for it paged)");
    }
    return absl::OkStatus();
  });
}

grpc::Status StorageService::Verify(grpc::ServerContext* ctx, const v1::VerifyRequest* req,
                                    v1::VerifyResponse* resp) {
  return Unary([&]() -> absl::Status {
    RETURN_IF_ERROR(Admit(*ctx, req->job(), req->step()));
    ASSIGN_OR_RETURN(storage::Manifest m, engine_->GetManifest(req->job(), req->step()));
    RETURN_IF_ERROR(engine_->Verify(req->job(), req->step()));
    resp->set_bytes_verified(m.info.raw_bytes);
    return absl::OkStatus();
  });
}

grpc::Status StorageService::Delete(grpc::ServerContext* ctx, const v1::DeleteRequest* req,
                                    v1::DeleteResponse*) {
  return Unary([&]() -> absl::Status {
    RETURN_IF_ERROR(Admit(*ctx, req->job(), req->step()));
    // Before and after: a commit of the step racing the delete may publish in between.
    cache_->Drop(req->job(), req->step());
    absl::Status deleted = engine_->Delete(req->job(), req->step(), req->epoch());
    cache_->Drop(req->job(), req->step());
    return deleted;
  });
}

grpc::Status StorageService::Gc(grpc::ServerContext* ctx, const v1::GcRequest* req,
                                v1::GcResponse* resp) {
  return Unary([&]() -> absl::Status {
    RETURN_IF_ERROR(proto::ValidateJob(req->job()));
    if (req->keep_last() < 0 || req->keep_last() > proto::kMaxGcKeep || req->keep_every() < 0 ||
        req->keep_every() > proto::kMaxGcKeep) {
      return absl::InvalidArgumentError("keep_last and keep_every must be in [0, 1000000]");
    }
    if (req->delete_fulls_size() > proto::kMaxGcKeep) {
      return absl::InvalidArgumentError("at most 1000000 delete_fulls");
    }
    RETURN_IF_ERROR(auth_->CheckJob(*ctx, req->job()));
    absl::StatusOr<storage::GcResult> gc;
    if (req->explicit_steps()) {  // the client decided over every node (common/gc_plan.h)
      gc = engine_->GcSteps(req->job(),
                            std::vector<int64_t>(req->delete_fulls().begin(),
                                                 req->delete_fulls().end()),
                            req->epoch());
      resp->set_explicit_steps(true);
    } else {
      storage::GcPolicy policy;
      policy.keep_last = req->keep_last();
      policy.keep_every = req->keep_every();
      gc = engine_->Gc(req->job(), policy, req->epoch());
    }
    if (!gc.ok()) {  // which steps went before the failure is unknown: none is served from RAM
      cache_->DropJob(req->job());
      return gc.status();
    }
    storage::GcResult& r = *gc;
    for (int64_t step : r.deleted_steps) {
      cache_->Drop(req->job(), step);
      resp->add_deleted_steps(step);
    }
    resp->set_bytes_reclaimed(r.bytes_reclaimed);
    return absl::OkStatus();
  });
}

}  // namespace service
}  // namespace gradsnap
