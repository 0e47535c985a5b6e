// EngineImpl, reads: catalog records (LoadCheckpoint, LoadChunks), listing, manifests, shard
// readers (shard_reader.cc) and Verify.
//
// LOCKING: none; nothing here takes mu_ or requires it. Each read is one RocksDB get or scan
// (each consistent in itself); a record changed meanwhile by a commit is read either before or
// after it. Callers that must decide on what they read (the commit rules, delete) hold mu_
// around these calls.
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"

namespace gradsnap {
namespace storage {
namespace {

CheckpointInfo ToInfo(const CheckpointRecord& r) {
  CheckpointInfo i;
  i.job = r.spec.job;
  i.step = r.spec.step;
  i.kind = r.spec.kind;
  i.base_step = r.spec.base_step;
  i.world_size = r.spec.world_size;
  i.state = r.state;
  i.raw_bytes = r.raw_bytes;
  i.stored_bytes = r.stored_bytes;
  i.created_unix_ms = r.created_unix_ms;
  i.committed_unix_ms = r.committed_unix_ms;
  i.metadata = r.spec.metadata;
  return i;
}

}  // namespace

absl::StatusOr<CheckpointRecord> EngineImpl::LoadCheckpoint(const std::string& job,
                                                            int64_t step) {
  auto v = meta_->Get(CheckpointKey(job, step));
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrCat("no checkpoint job ", job, " step ", step));
  }
  if (!v.ok()) return v.status();
  CheckpointRecord r;
  RETURN_IF_ERROR(DecodeCheckpoint(*v, &r));
  return r;
}

absl::StatusOr<std::vector<ChunkRecord>> EngineImpl::LoadChunks(const std::string& job,
                                                                int64_t step, int32_t rank,
                                                                uint32_t count) {
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(ChunkPrefix(job, step, rank)));
  std::vector<ChunkRecord> out;
  for (const auto& [k, v] : kvs) {
    ChunkRecord c;
    RETURN_IF_ERROR(Annotate(DecodeChunk(v, &c), Where(job, step, rank)));
    out.push_back(c);
  }
  if (out.size() < count) {
    return absl::DataLossError(absl::StrCat(Where(job, step, rank), ": ", count - out.size(),
                                            " chunk records missing"));
  }
  out.resize(count);  // keys past chunk_count are never written, but be strict
  return out;
}

absl::StatusOr<std::vector<std::string>> EngineImpl::ListJobs() {
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan("c/"));
  std::vector<std::string> jobs;
  for (const auto& [k, v] : kvs) {
    std::string job = k.substr(2, k.rfind('/') - 2);
    if (jobs.empty() || jobs.back() != job) jobs.push_back(job);
  }
  return jobs;
}

absl::StatusOr<std::vector<CheckpointInfo>> EngineImpl::ListCheckpoints(const std::string& job,
                                                                        bool include_pending) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(CheckpointPrefix(job)));
  std::vector<CheckpointInfo> out;
  for (const auto& [k, v] : kvs) {
    CheckpointRecord r;
    RETURN_IF_ERROR(DecodeCheckpoint(v, &r));
    if (r.state == CheckpointState::kCommitted || include_pending) out.push_back(ToInfo(r));
  }
  return out;
}

absl::StatusOr<ShardInfo> EngineImpl::MakeShardInfo(const ShardRecord& rec,
                                                    const std::vector<ChunkRecord>& chunks) {
  ShardInfo info;
  info.rank = rec.spec.rank;
  info.committed = rec.committed;
  info.stored_bytes = rec.stored_bytes;
  info.metadata = rec.spec.metadata;
  info.digest_algo = rec.digest_algo;
  for (size_t i = 0; i < rec.spec.tensors.size(); ++i) {
    TensorInfo ti;
    ti.spec = rec.spec.tensors[i];
    ti.digest_algo = rec.digest_algo;
    ti.digest = i < rec.tensor_digests.size() ? rec.tensor_digests[i] : "";
    if (rec.digest_algo == DigestAlgo::kSha256) ti.spec.sha256 = ti.digest;
    info.raw_bytes += ti.spec.byte_length;
    info.tensors.push_back(std::move(ti));
  }
  const std::vector<uint64_t> starts = TensorStarts(rec.spec);
  for (const ChunkRecord& c : chunks) {
    if (absl::Status s = CheckChunkPlacement(starts, c); !s.ok()) {
      return absl::DataLossError(absl::StrCat(Where(rec.spec.job, rec.spec.step, rec.spec.rank),
                                              ": ", s.message()));
    }
    if (c.members.empty()) {
      info.tensors[c.tensor].stored_bytes += c.header.record_len();
      info.tensors[c.tensor].chunks += 1;
      continue;
    }
    // A packed chunk's record bytes are shared in proportion to each tensor's raw bytes.
    uint64_t left = c.header.record_len();
    for (size_t i = 0; i < c.members.size(); ++i) {
      const ChunkMember& m = c.members[i];
      uint64_t share = i + 1 == c.members.size()
                           ? left
                           : c.header.record_len() * uint64_t{m.length} / c.header.raw_len;
      info.tensors[m.tensor].stored_bytes += share;
      info.tensors[m.tensor].chunks += 1;
      left -= share;
    }
  }
  return info;
}

absl::StatusOr<Manifest> EngineImpl::GetManifest(const std::string& job, int64_t step) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  Manifest m;
  m.info = ToInfo(ckpt);
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(ShardPrefix(job, step)));
  for (const auto& [k, v] : kvs) {
    ShardRecord r;
    RETURN_IF_ERROR(DecodeShard(v, &r));
    ASSIGN_OR_RETURN(std::vector<ChunkRecord> chunks,
                     LoadChunks(job, step, r.spec.rank, r.chunk_count));
    ASSIGN_OR_RETURN(ShardInfo si, MakeShardInfo(r, chunks));
    m.shards.push_back(std::move(si));
  }
  return m;
}

absl::StatusOr<std::unique_ptr<ShardReader>> EngineImpl::OpenShardReader(const std::string& job,
                                                                         int64_t step,
                                                                         int32_t rank) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  if (ckpt.state != CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", job, " step ", step,
                                                      " is not committed"));
  }
  return OpenCommittedShard(job, step, rank);
}

absl::StatusOr<std::unique_ptr<ShardReader>> EngineImpl::OpenCommittedShard(
    const std::string& job, int64_t step, int32_t rank) {
  auto v = meta_->Get(ShardKey(job, step, rank));
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrCat("no shard ", Where(job, step, rank)));
  }
  if (!v.ok()) return v.status();
  ShardRecord r;
  RETURN_IF_ERROR(DecodeShard(*v, &r));
  if (!r.committed) {
    return absl::FailedPreconditionError(absl::StrCat(Where(job, step, rank),
                                                      " is not committed"));
  }
  return NewShardReader(this, std::move(r));
}

absl::Status EngineImpl::ReadBackShard(const std::string& job, int64_t step, int32_t rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> r, OpenCommittedShard(job, step, rank));
  std::vector<uint8_t> buf(options_.chunk_bytes);
  uint64_t pos = 0;
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, r->Read(pos, buf.data(), buf.size()));
    if (n == 0) break;
    pos += n;
  }
  if (pos != r->info().raw_bytes) {
    return absl::DataLossError(absl::StrCat(Where(job, step, rank), ": read ", pos, " of ",
                                            r->info().raw_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::Verify(const std::string& job, int64_t step) {
  ASSIGN_OR_RETURN(Manifest m, GetManifest(job, step));
  if (m.info.state != CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", job, " step ", step,
                                                      " is not committed"));
  }
  if (static_cast<int32_t>(m.shards.size()) != m.info.world_size) {
    return absl::DataLossError(absl::StrCat("checkpoint job ", job, " step ", step, " has ",
                                            m.shards.size(), " of ", m.info.world_size,
                                            " shards"));
  }
  for (const ShardInfo& s : m.shards) RETURN_IF_ERROR(ReadBackShard(job, step, s.rank));
  return absl::OkStatus();
}

}  // namespace storage
}  // namespace gradsnap
