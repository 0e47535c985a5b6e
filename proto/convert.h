// Conversion between the wire messages (proto/gradsnap.proto) and the plain data model
// (storage/types.h), plus the protocol's limits and request validation.
//
// Shared by the service (server side) and the remote client back end, so both sides agree on
// every limit. FromProto functions validate: anything a hostile peer could send that the engine
// should never see (bad names, unknown enums, huge or inconsistent sizes) is INVALID_ARGUMENT.
// Also the one place where a grpc::Status becomes an absl::Status and back (codes are equal).
//
// Thread-safe: free functions without state.
#ifndef GRADSNAP_PROTO_CONVERT_H_
#define GRADSNAP_PROTO_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "proto/gradsnap.pb.h"
#include "gradsnap/types.h"

namespace gradsnap {
namespace proto {

// Largest message either side accepts (docs/protocol.md).
constexpr size_t kMaxMessageBytes = 4u << 20;
// What a Write or Read message's fields other than the spec or info and the data take at most
// (tags, lengths, offset, finish flag).
constexpr size_t kMaxFramingBytes = 64;
// The largest spec (first Write message) or shard info (first Read message) a message holds.
constexpr size_t kMaxHeadBytes = kMaxMessageBytes - kMaxFramingBytes;
// The data a first message carries beside a head of `head_bytes` (<= kMaxHeadBytes), out of
// `want` (<= kMaxDataBytes): what fits, possibly none.
constexpr size_t FirstMessageData(size_t head_bytes, size_t want) {
  return want < kMaxHeadBytes - head_bytes ? want : kMaxHeadBytes - head_bytes;
}
// Largest `data` field in WriteRequest / ReadResponse; senders use exactly this size.
constexpr size_t kMaxDataBytes = 1u << 20;
constexpr size_t kMaxMetadataBytes = 1u << 20;
constexpr size_t kMaxTensorsPerShard = 100000;
constexpr size_t kMaxDims = 16;
constexpr uint64_t kMaxTensorBytes = 1ull << 40;
constexpr int32_t kMaxWorldSize = 65536;
constexpr int32_t kMaxGcKeep = 1000000;

// gRPC <-> Abseil status (equal codes; unknown numbers become UNKNOWN).
absl::Status FromGrpc(const grpc::Status& s);
grpc::Status ToGrpc(const absl::Status& s);

// Field validators used by the service for unary requests.
absl::Status ValidateJob(const std::string& job);
absl::Status ValidateStep(int64_t step);
absl::Status ValidateRank(int32_t rank);

// Whether two records of a shard describe the same bytes: the same tensors (names, sizes,
// digest algorithms and digests), in order. A replica's answer against the one a restore
// began with (remote client), a RAM-tier copy against the committed manifest (service).
bool SameTensorContent(const storage::ShardInfo& a, const storage::ShardInfo& b);

// Data model -> wire.
void ToProto(const storage::TensorSpec& in, gradsnap::v1::TensorSpec* out);
void ToProto(const storage::CheckpointSpec& in, gradsnap::v1::CheckpointSpec* out);
void ToProto(const storage::ShardSpec& in, gradsnap::v1::ShardSpec* out);
void ToProto(const storage::TensorInfo& in, gradsnap::v1::TensorInfo* out);
void ToProto(const storage::ShardInfo& in, gradsnap::v1::ShardInfo* out);
void ToProto(const storage::CheckpointInfo& in, gradsnap::v1::CheckpointInfo* out);
void ToProto(const storage::Manifest& in, gradsnap::v1::Manifest* out);

// Wire -> data model, validated.
absl::StatusOr<storage::TensorSpec> FromProto(const gradsnap::v1::TensorSpec& in);
absl::StatusOr<storage::CheckpointSpec> FromProto(const gradsnap::v1::CheckpointSpec& in);
absl::StatusOr<storage::ShardSpec> FromProto(const gradsnap::v1::ShardSpec& in);
// Wire -> data model for answers (client side): converted leniently, enums range-checked.
absl::StatusOr<storage::ShardInfo> FromProto(const gradsnap::v1::ShardInfo& in);
absl::StatusOr<storage::CheckpointInfo> FromProto(const gradsnap::v1::CheckpointInfo& in);
absl::StatusOr<storage::Manifest> FromProto(const gradsnap::v1::Manifest& in);

// Sum of byte_length over a shard's tensors (the payload size).
uint64_t PayloadSize(const storage::ShardSpec& spec);

// The most bytes the ShardInfo of a shard written from `spec` with digests `algo` can take on
// the wire: its spec plus, per tensor, the digest (repeated in spec.sha256 for SHA-256) and the
// stored size and chunk count at their widest. A Read's first message carries it whole, so a spec whose bound passes
// kMaxMessageBytes is refused at the upload's first message: nothing the server stores is
// unreadable over the wire.
size_t ShardInfoBytesBound(const storage::ShardSpec& spec, DigestAlgo algo);

}  // namespace proto
}  // namespace gradsnap

#endif  // GRADSNAP_PROTO_CONVERT_H_
