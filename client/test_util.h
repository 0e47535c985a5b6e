// Test-only helpers: deterministic random shards of several dtypes, saved through the Client
// interface, with the expected bytes kept for comparison. Used by client_test and the CLI
// end-to-end tests (tests/cli/). Not part of the product library.
#ifndef GRADSNAP_CLIENT_TEST_UTIL_H_
#define GRADSNAP_CLIENT_TEST_UTIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"

namespace gradsnap {
namespace client {
namespace testing {

struct TestTensor {
  TensorSpec spec;
  std::string data;  // spec.byte_length bytes
};

struct TestShard {
  int32_t rank = 0;
  std::vector<TestTensor> tensors;
  std::string metadata;
  std::string Payload() const;  // tensors' bytes back to back, in order
  std::vector<TensorRef> Refs() const;
};

// A shard with tensors of every dtype (f32, bf16, f16, f64, i32, i64, u8), a scalar, a slice of
// a flat buffer, and one tensor of `big_bytes` f32 bytes spanning several chunks. Mixes
// random and compressible data. Deterministic in (seed, rank).
TestShard MakeShard(uint64_t seed, int32_t rank, uint64_t big_bytes = 5u << 20);

// A client of the embedded engine in `dir` (created if missing).
absl::StatusOr<std::unique_ptr<Client>> ConnectLocal(const std::string& dir);

struct TestCheckpoint {
  CheckpointSpec spec;
  std::vector<TestShard> shards;  // by rank
};

// Begins and saves every rank of a FULL checkpoint (ranks saved concurrently).
absl::StatusOr<TestCheckpoint> SaveTestCheckpoint(Client& client, const std::string& job,
                                                  int64_t step, int32_t world_size, uint64_t seed,
                                                  uint64_t big_bytes = 5u << 20);

}  // namespace testing
}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_TEST_UTIL_H_
