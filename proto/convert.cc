#include "proto/convert.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "common/digest.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/status.h"

namespace gradsnap {
namespace proto {
namespace {

namespace v1 = ::gradsnap::v1;

absl::Status Bad(absl::string_view msg) { return absl::InvalidArgumentError(msg); }

bool IsLowerHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<storage::CheckpointKind> KindFromProto(int v) {
  if (v == v1::CHECKPOINT_KIND_FULL) return storage::CheckpointKind::kFull;
  if (v == v1::CHECKPOINT_KIND_DELTA) return storage::CheckpointKind::kDelta;
  return Bad(absl::StrCat("unknown checkpoint kind ", v));
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  int code = static_cast<int>(s.error_code());
  if (code < 0 || code > 16) code = static_cast<int>(absl::StatusCode::kUnknown);
  return absl::Status(static_cast<absl::StatusCode>(code), s.error_message());
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status ValidateJob(const std::string& job) { return ValidateName(job, "job name"); }

absl::Status ValidateStep(int64_t step) {
  if (step < 0) return Bad(absl::StrCat("step ", step, " is negative"));
  return absl::OkStatus();
}

absl::Status ValidateRank(int32_t rank) {
  if (rank < 0 || rank >= kMaxWorldSize) return Bad(absl::StrCat("rank ", rank, " out of range"));
  return absl::OkStatus();
}

bool SameTensorContent(const storage::ShardInfo& a, const storage::ShardInfo& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const storage::TensorInfo& x = a.tensors[i];
    const storage::TensorInfo& y = b.tensors[i];
    if (x.spec.name != y.spec.name || x.spec.byte_length != y.spec.byte_length ||
        x.digest_algo != y.digest_algo || x.digest != y.digest) {
      return false;
    }
  }
  return true;
}

void ToProto(const storage::TensorSpec& in, v1::TensorSpec* out) {
  out->set_name(in.name);
  out->set_dtype(static_cast<v1::DType>(in.dtype));
  for (int64_t d : in.shape) out->add_shape(d);
  out->set_byte_length(in.byte_length);
  out->set_flat_name(in.flat_name);
  out->set_flat_offset(in.flat_offset);
  out->set_flat_total(in.flat_total);
  out->set_sha256(in.sha256);
}

namespace {

// The fields CheckpointSpec and CheckpointInfo share (same names on both sides).
template <typename In, typename Out>
void CheckpointFieldsToProto(const In& in, Out* out) {
  out->set_job(in.job);
  out->set_step(in.step);
  out->set_kind(static_cast<v1::CheckpointKind>(in.kind));
  out->set_base_step(in.base_step);
  out->set_world_size(in.world_size);
  out->set_metadata(in.metadata);
}

// Wire -> model for the same shared fields (kind is converted with its own check).
template <typename In, typename Out>
void CheckpointFieldsFromProto(const In& in, Out* out) {
  out->job = in.job();
  out->step = in.step();
  out->base_step = in.base_step();
  out->world_size = in.world_size();
  out->metadata = in.metadata();
}

}  // namespace

void ToProto(const storage::CheckpointSpec& in, v1::CheckpointSpec* out) {
  CheckpointFieldsToProto(in, out);
  out->set_epoch(in.epoch);
}

void ToProto(const storage::ShardSpec& in, v1::ShardSpec* out) {
  out->set_job(in.job);
  out->set_step(in.step);
  out->set_rank(in.rank);
  for (const auto& t : in.tensors) ToProto(t, out->add_tensors());
  out->set_metadata(in.metadata);
  out->set_epoch(in.epoch);
}

void ToProto(const storage::ShardInfo& in, v1::ShardInfo* out) {
  out->set_rank(in.rank);
  out->set_committed(in.committed);
  out->set_raw_bytes(in.raw_bytes);
  out->set_stored_bytes(in.stored_bytes);
  out->set_metadata(in.metadata);
  out->set_digest_algorithm(static_cast<v1::DigestAlgorithm>(in.digest_algo));
  for (const auto& t : in.tensors) ToProto(t, out->add_tensors());
}

size_t ShardInfoBytesBound(const storage::ShardSpec& spec, DigestAlgo algo) {
  using google::protobuf::io::CodedOutputStream;
  const size_t digits = algo == DigestAlgo::kSha256 ? 64 : 32;
  v1::ShardInfo head;
  head.set_rank(spec.rank);
  head.set_committed(true);
  head.set_raw_bytes(UINT64_MAX);
  head.set_stored_bytes(UINT64_MAX);
  head.set_metadata(spec.metadata);
  head.set_digest_algorithm(static_cast<v1::DigestAlgorithm>(algo));
  size_t bytes = head.ByteSizeLong();
  v1::TensorInfo t;
  t.set_digest(std::string(digits, 'f'));
  for (const storage::TensorSpec& s : spec.tensors) {
    t.mutable_spec()->Clear();  // ToProto appends the shape
    ToProto(s, t.mutable_spec());
    if (algo == DigestAlgo::kSha256 && s.sha256.empty()) {
      t.mutable_spec()->set_sha256(std::string(64, 'f'));  // the digest, repeated
    }
    // Widest varints: a tensor written over many resumed streams has more (and smaller)
    // chunks than its size suggests.
    t.set_stored_bytes(UINT64_MAX);
    t.set_chunks(UINT32_MAX);
    const size_t n = t.ByteSizeLong();
    bytes += 1 + CodedOutputStream::VarintSize64(n) + n;  // field 6: tag, length, message
  }
  return bytes;
}

void ToProto(const storage::TensorInfo& in, v1::TensorInfo* out) {
  ToProto(in.spec, out->mutable_spec());
  out->set_stored_bytes(in.stored_bytes);
  out->set_chunks(in.chunks);
  out->set_digest(in.digest);
}

void ToProto(const storage::CheckpointInfo& in, v1::CheckpointInfo* out) {
  CheckpointFieldsToProto(in, out);
  out->set_state(static_cast<v1::CheckpointState>(in.state));
  out->set_raw_bytes(in.raw_bytes);
  out->set_stored_bytes(in.stored_bytes);
  out->set_created_unix_ms(in.created_unix_ms);
  out->set_committed_unix_ms(in.committed_unix_ms);
}

void ToProto(const storage::Manifest& in, v1::Manifest* out) {
  ToProto(in.info, out->mutable_info());
  for (const auto& s : in.shards) ToProto(s, out->add_shards());
}

absl::StatusOr<storage::TensorSpec> FromProto(const v1::TensorSpec& in) {
  storage::TensorSpec t;
  RETURN_IF_ERROR(ValidateName(in.name(), "tensor name"));
  t.name = in.name();
  std::optional<DType> dtype = DTypeFromInt(static_cast<uint32_t>(in.dtype()));
  if (!dtype || *dtype == DType::kUnknown) {
    return Bad(absl::StrCat("tensor ", in.name(), ": unknown dtype ", in.dtype()));
  }
  t.dtype = *dtype;
  if (static_cast<size_t>(in.shape_size()) > kMaxDims) {
    return Bad(absl::StrCat("tensor ", in.name(), ": more than ", kMaxDims, " dimensions"));
  }
  if (in.byte_length() > kMaxTensorBytes) {
    return Bad(absl::StrCat("tensor ", in.name(), ": byte_length over 1 TiB"));
  }
  // numel * size == byte_length, computed without overflow (every dim <= 2^40).
  uint64_t numel = 1;
  for (int64_t d : in.shape()) {
    if (d < 0 || static_cast<uint64_t>(d) > kMaxTensorBytes) {
      return Bad(absl::StrCat("tensor ", in.name(), ": bad dimension ", d));
    }
    numel = (d == 0 || numel == 0) ? 0 : numel * static_cast<uint64_t>(d);
    if (numel > kMaxTensorBytes) return Bad(absl::StrCat("tensor ", in.name(), ": too large"));
    t.shape.push_back(d);
  }
  if (numel * DTypeSize(t.dtype) != in.byte_length()) {
    return Bad(absl::StrCat("tensor ", in.name(), ": shape and dtype give ",
                            numel * DTypeSize(t.dtype), " bytes, byte_length is ",
                            in.byte_length()));
  }
  t.byte_length = in.byte_length();
  if (!in.flat_name().empty()) {
    RETURN_IF_ERROR(ValidateName(in.flat_name(), "flat buffer name"));
    if (in.flat_total() > kMaxTensorBytes || in.flat_offset() > in.flat_total() ||
        in.flat_total() - in.flat_offset() < numel) {
      return Bad(absl::StrCat("tensor ", in.name(), ": slice outside its flat buffer"));
    }
  }
  t.flat_name = in.flat_name();
  t.flat_offset = in.flat_offset();
  t.flat_total = in.flat_total();
  if (!in.sha256().empty() && !IsLowerHex64(in.sha256())) {
    return Bad(absl::StrCat("tensor ", in.name(), ": sha256 is not 64 lower-case hex digits"));
  }
  t.sha256 = in.sha256();
  return t;
}

absl::StatusOr<storage::CheckpointSpec> FromProto(const v1::CheckpointSpec& in) {
  storage::CheckpointSpec c;
  RETURN_IF_ERROR(ValidateJob(in.job()));
  RETURN_IF_ERROR(ValidateStep(in.step()));
  ASSIGN_OR_RETURN(c.kind, KindFromProto(in.kind()));
  if (c.kind == storage::CheckpointKind::kFull && in.base_step() != -1) {
    return Bad("a FULL checkpoint must have base_step -1");
  }
  if (c.kind == storage::CheckpointKind::kDelta &&
      (in.base_step() < 0 || in.base_step() >= in.step())) {
    return Bad("a DELTA checkpoint needs 0 <= base_step < step");
  }
  if (in.world_size() < 1 || in.world_size() > kMaxWorldSize) {
    return Bad(absl::StrCat("world_size ", in.world_size(), " outside [1, 65536]"));
  }
  if (in.metadata().size() > kMaxMetadataBytes) return Bad("checkpoint metadata over 1 MiB");
  CheckpointFieldsFromProto(in, &c);
  c.epoch = in.epoch();
  return c;
}

absl::StatusOr<storage::ShardSpec> FromProto(const v1::ShardSpec& in) {
  storage::ShardSpec s;
  RETURN_IF_ERROR(ValidateJob(in.job()));
  RETURN_IF_ERROR(ValidateStep(in.step()));
  RETURN_IF_ERROR(ValidateRank(in.rank()));
  if (static_cast<size_t>(in.tensors_size()) > kMaxTensorsPerShard) {
    return Bad("more than 100000 tensors in a shard");
  }
  if (in.metadata().size() > kMaxMetadataBytes) return Bad("shard metadata over 1 MiB");
  std::set<std::string> names;
  uint64_t total = 0;
  for (const auto& t : in.tensors()) {
    ASSIGN_OR_RETURN(storage::TensorSpec spec, FromProto(t));
    if (!names.insert(spec.name).second) {
      return Bad(absl::StrCat("tensor name ", spec.name, " appears twice"));
    }
    total += spec.byte_length;
    if (total > kMaxTensorBytes) return Bad("shard payload over 1 TiB");
    s.tensors.push_back(std::move(spec));
  }
  s.job = in.job();
  s.step = in.step();
  s.rank = in.rank();
  s.metadata = in.metadata();
  s.epoch = in.epoch();
  return s;
}

absl::StatusOr<storage::ShardInfo> FromProto(const v1::ShardInfo& in) {
  storage::ShardInfo s;
  s.rank = in.rank();
  s.committed = in.committed();
  s.raw_bytes = in.raw_bytes();
  s.stored_bytes = in.stored_bytes();
  s.metadata = in.metadata();
  // UNSPECIFIED: a server that predates the field, whose digests are SHA-256 in spec.sha256.
  const bool legacy = in.digest_algorithm() == v1::DIGEST_ALGORITHM_UNSPECIFIED;
  if (!legacy && !IsKnownDigestAlgo(static_cast<uint8_t>(in.digest_algorithm()))) {
    return absl::DataLossError(absl::StrCat("rank ", in.rank(), ": unknown digest algorithm ",
                                            static_cast<int>(in.digest_algorithm())));
  }
  s.digest_algo = legacy ? DigestAlgo::kSha256 : static_cast<DigestAlgo>(in.digest_algorithm());
  for (const auto& t : in.tensors()) {
    storage::TensorInfo ti;
    ASSIGN_OR_RETURN(ti.spec, FromProto(t.spec()));
    ti.stored_bytes = t.stored_bytes();
    ti.chunks = t.chunks();
    ti.digest_algo = s.digest_algo;
    ti.digest = legacy ? t.spec().sha256() : t.digest();
    s.tensors.push_back(std::move(ti));
  }
  return s;
}

absl::StatusOr<storage::CheckpointInfo> FromProto(const v1::CheckpointInfo& in) {
  storage::CheckpointInfo c;
  CheckpointFieldsFromProto(in, &c);
  ASSIGN_OR_RETURN(c.kind, KindFromProto(in.kind()));
  if (in.state() == v1::CHECKPOINT_STATE_PENDING) {
    c.state = storage::CheckpointState::kPending;
  } else if (in.state() == v1::CHECKPOINT_STATE_COMMITTED) {
    c.state = storage::CheckpointState::kCommitted;
  } else {
    return Bad(absl::StrCat("unknown checkpoint state ", in.state()));
  }
  c.raw_bytes = in.raw_bytes();
  c.stored_bytes = in.stored_bytes();
  c.created_unix_ms = in.created_unix_ms();
  c.committed_unix_ms = in.committed_unix_ms();
  return c;
}

absl::StatusOr<storage::Manifest> FromProto(const v1::Manifest& in) {
  storage::Manifest m;
  ASSIGN_OR_RETURN(m.info, FromProto(in.info()));
  for (const auto& s : in.shards()) {
    ASSIGN_OR_RETURN(storage::ShardInfo info, FromProto(s));
    m.shards.push_back(std::move(info));
  }
  return m;
}

uint64_t PayloadSize(const storage::ShardSpec& spec) {
  uint64_t total = 0;
  for (const auto& t : spec.tensors) total += t.byte_length;
  return total;
}

}  // namespace proto
}  // namespace gradsnap
