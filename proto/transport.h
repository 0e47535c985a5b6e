// HTTP/2 transport settings shared by gradsnap-server and the remote client (docs/protocol.md,
// "Transport tuning"). Payload messages are 1 MiB; gRPC's defaults are sized for small RPCs
// (16 KiB frames, small read chunks, windows that grow only after probing), so a bulk stream
// spends its CPU on frame headers, syscalls and window updates. These settings are local to
// each side and do not change the wire protocol: HTTP/2 peers negotiate frame sizes and windows.
#ifndef GRADSNAP_PROTO_TRANSPORT_H_
#define GRADSNAP_PROTO_TRANSPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "grpc/impl/codegen/grpc_types.h"

namespace gradsnap {
namespace proto {

// {gRPC channel argument, value} pairs applied to client channels and the server alike.
inline std::vector<std::pair<std::string, int>> TransportArgs() {
  return {
      // Largest HTTP/2 frame this side accepts: a 1 MiB message crosses in one frame instead
      // of 64 frames of 16 KiB. gRPC default: 16 KiB.
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 << 20},
      // Initial per-stream receive window target: a bulk stream starts at full speed instead of
      // waiting for the BDP probe to grow a 64 KiB window. gRPC default: 64 KiB.
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20},
      // Socket reads of at least 256 KiB once a stream is busy (fewer syscalls and slices per
      // message), at most 1 MiB: gradsnap-server mmaps allocations from 2 MiB up
      // (server_main.cc), and a read buffer above that would be faulted in afresh every read.
      // gRPC default: 256 bytes min, 4 MiB max.
      {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 << 10},
      {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 1 << 20},
      // Bytes the transport may queue for writing before it pushes back. gRPC default: 64 KiB.
      {GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20},
  };
}

}  // namespace proto
}  // namespace gradsnap

#endif  // GRADSNAP_PROTO_TRANSPORT_H_
