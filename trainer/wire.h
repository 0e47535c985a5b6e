// The funnel protocol between ranks and rank 0 in embedded multi-rank mode (shard_store.h):
// length-prefixed messages over Comm::Send/Recv and their little-endian encodings. Internal.
// Thread safety: free functions.
#ifndef GRADSNAP_TRAINER_WIRE_H_
#define GRADSNAP_TRAINER_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "trainer/comm.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace trainer {

absl::Status SendMessage(Comm& comm, int dst, uint32_t tag, const std::string& msg);
absl::StatusOr<std::string> RecvMessage(Comm& comm, int src, uint32_t tag);

std::string EncodeStatus(const absl::Status& s);
absl::Status DecodeStatus(const std::string& msg);

// A shard spec and its tensor bytes. Decoded TensorRefs point into `msg`.
std::string EncodeShard(const client::ShardSpec& spec,
                        const std::vector<client::TensorRef>& tensors);
absl::Status DecodeShard(const std::string& msg, client::ShardSpec* spec,
                         std::vector<client::TensorRef>* tensors);

std::string EncodeInfos(const absl::StatusOr<std::vector<client::CheckpointInfo>>& infos);
absl::StatusOr<std::vector<client::CheckpointInfo>> DecodeInfos(const std::string& msg);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_WIRE_H_
