// Protobuf wire format over gRPC slices, for the two messages that carry payload bytes
// (WriteRequest and ReadResponse, proto/gradsnap.proto): both sides build and parse them by
// hand so that `data` travels as grpc::Slice references, never copied into a std::string.
//
// The bytes on the wire are exactly the protobuf encoding of the documented messages (fields in
// number order; a receiver accepts any order, as protobuf parsers do), so peers that use the
// generated classes interoperate with peers that use this (docs/protocol.md, "Zero-copy
// framing").
//
// Thread-safe: free functions and value types without shared state, except the process-wide
// counter of OwnedSlice buffers still referenced.
#ifndef GRADSNAP_PROTO_RAW_MESSAGE_H_
#define GRADSNAP_PROTO_RAW_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace gradsnap {
namespace proto {

// Field numbers of the payload messages (proto/gradsnap.proto).
namespace field {
constexpr uint32_t kWriteShard = 1, kWriteOffset = 2, kWriteData = 3, kWriteFinish = 4;
constexpr uint32_t kReadShard = 1, kReadOffset = 2, kReadData = 3;
}  // namespace field

// Indexes of Write and Read among gradsnap.v1.Storage's methods (their order in
// gradsnap.proto), for servers that register raw handlers for them (Service::MarkMethodStreamed;
// checked by every test that writes or reads through a server).
namespace method {
constexpr int kWrite = 4, kRead = 6;
}  // namespace method

// Builds one message: small fields are encoded into a header buffer, `data` pieces are appended
// as slices (referenced, not copied). Fields must be added in number order.
class RawMessageBuilder {
 public:
  // A varint field; proto3 omits zero values, so does this.
  void AddVarint(uint32_t field, uint64_t value);
  // A length-delimited field whose bytes are copied (small: specs, headers). Written even when
  // empty: it is used for message fields, whose presence counts.
  void AddBytes(uint32_t field, absl::string_view bytes);
  // A length-delimited field whose content is `pieces` (total `size` bytes), referenced.
  void AddSlices(uint32_t field, std::vector<grpc::Slice> pieces, uint64_t size);
  // The message; the builder is empty afterwards.
  grpc::ByteBuffer Finish();

 private:
  void FlushHeader();
  std::string header_;
  std::vector<grpc::Slice> slices_;
};

// One field of a parsed message. Varint fields fill `varint`; length-delimited ones fill
// `pieces` with references into the received buffer (`size` bytes in all).
struct RawField {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t varint = 0;
  std::vector<grpc::Slice> pieces;
  uint64_t size = 0;
  // The pieces copied into one string (for small fields such as a spec).
  std::string Flatten() const;
};

// Calls fn for every field of the message in bb, in wire order; stops at fn's first error.
// Fixed-width fields are skipped. Malformed wire bytes (a truncated varint or a length past the
// end) fail with `code` and "malformed <what>" (what: e.g. "Read message"): DATA_LOSS for an
// answer a client received, INVALID_ARGUMENT for a request the server received.
absl::Status ForEachField(const grpc::ByteBuffer& bb, absl::string_view what,
                          absl::StatusCode code,
                          const std::function<absl::Status(RawField&)>& fn);

// Buffers of a fixed size lent to gRPC as slices and given back when gRPC releases them, so a
// stream of messages reuses warm memory instead of allocating (and page-faulting) 1 MiB per
// message. Keeps at most `keep` free buffers. Thread-safe; slices stay valid after the pool is
// destroyed (a late release then frees its buffer).
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> Create(size_t buffer_bytes, size_t keep);
  // A slice over the first n (<= buffer_bytes) bytes of a pooled buffer; *data points at them
  // for the caller to fill before handing the slice to gRPC.
  grpc::Slice Take(size_t n, char** data);

 private:
  BufferPool(size_t buffer_bytes, size_t keep) : buffer_bytes_(buffer_bytes), keep_(keep) {}
  void Give(std::unique_ptr<char[]> buf);
  const size_t buffer_bytes_;
  const size_t keep_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<char[]>> free_ ABSL_GUARDED_BY(mu_);
};

// A slice over buf[0, len) that calls release() once gRPC and every copy of the slice are done
// with it (on any thread). Counted in OutstandingOwnedSlices() until then.
grpc::Slice OwnedSlice(void* buf, size_t len, std::function<void()> release);
// OwnedSlice buffers not yet released, process-wide (tests check that releases happen).
int64_t OutstandingOwnedSlices();

}  // namespace proto
}  // namespace gradsnap

#endif  // GRADSNAP_PROTO_RAW_MESSAGE_H_
