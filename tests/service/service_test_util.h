// Helpers for the service tests: a metrics scrape, TLS material made with the openssl command
// line, and deterministic shard data. The gradsnap-server child process and temporary
// directories come from tests/testing/ (GRADSNAP_SERVER_BIN names the server binary).
//
// Not thread-safe per object; each test owns its helpers.
#ifndef GRADSNAP_TESTS_SERVICE_SERVICE_TEST_UTIL_H_
#define GRADSNAP_TESTS_SERVICE_SERVICE_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/gradsnap.grpc.pb.h"
#include "proto/gradsnap.pb.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace gradsnap {
namespace testing {

// Starts `server` on `data_dir` (127.0.0.1, a free port) with `flags`, and connects a remote
// client to it.
absl::StatusOr<std::unique_ptr<client::Client>> StartAndConnect(
    ServerProcess* server, const std::string& data_dir, const std::vector<std::string>& flags);

// A gradsnap-server on a fresh directory (its data in dir/data) started with `flags`, and a
// remote client of it (nullptr when either failed; StartAndConnect's status says why).
struct TestNode {
  explicit TestNode(const std::vector<std::string>& flags = {});
  TempDir dir;
  ServerProcess server{GRADSNAP_SERVER_BIN};
  absl::Status status;
  std::unique_ptr<client::Client> client;
};

// A remote client of the server at `address` that tries each call up to `max_attempts` times
// and restores over `read_streams` parallel Read streams; nullptr when connecting failed.
std::unique_ptr<client::Client> ConnectTo(const std::string& address, int max_attempts,
                                          int read_streams = 1);

// A TCP connection to 127.0.0.1:port whose reads time out after `recv_timeout_s`; the caller
// closes the descriptor.
absl::StatusOr<int> ConnectLoopback(int port, int recv_timeout_s);
// GET http://127.0.0.1:port/metrics, the body.
absl::StatusOr<std::string> HttpGet(int port);
// The value of metric `name` (full name with labels) in a Prometheus text body, or -1.
double MetricValue(const std::string& body, const std::string& name);

// TLS material in `dir`: ca.pem/ca.key, server.pem/server.key (CN localhost, SAN 127.0.0.1),
// client.pem/client.key signed by the CA, and other-ca.pem (an unrelated CA).
absl::Status MakeTlsMaterial(const std::string& dir);

// A shard whose tensors hold deterministic pseudo-random bytes.
struct TestShard {
  client::ShardSpec spec;
  std::vector<std::string> data;  // per tensor
  std::vector<client::TensorRef> Refs() const;
  std::string Payload() const;  // concatenation
};
TestShard MakeShard(const std::string& job, int64_t step, int32_t rank,
                    const std::vector<uint64_t>& tensor_bytes, uint64_t seed);

client::CheckpointSpec FullSpec(const std::string& job, int64_t step, int32_t world_size);

// Cluster mode: a client of the etcd `etcd_endpoints` placing R = 3 copies, W = 2 needed, 3
// attempts per call, 10 s calls.
absl::StatusOr<std::unique_ptr<client::Client>> ConnectCluster(const std::string& etcd_endpoints);
// Begins (job, step) with one rank at `epoch` through `c` and saves for it a shard of one 1 MiB
// tensor made from `seed`: the shard saved, or the first error.
absl::StatusOr<TestShard> SaveOneRank(client::Client* c, const std::string& job, int64_t step,
                                      uint64_t epoch, uint64_t seed);

// Sends the first `bytes` of single-tensor shard `shard` on a raw Write `stream` (the spec in
// the first message, then 1 MiB messages), without finish_write: a client that stops or
// vanishes part-way. False if a write failed.
bool SendRawPrefix(grpc::ClientWriter<v1::WriteRequest>* stream, const TestShard& shard,
                   uint64_t bytes);

// A raw (generated) stub of the Storage service at `address`, over an insecure channel: for
// tests that speak the wire protocol below the client library.
std::unique_ptr<v1::Storage::Stub> RawStub(const std::string& address);

// Asks QueryWriteStatus how much of shard (job, step, rank) is durable for writer `epoch`.
absl::StatusOr<uint64_t> QueryCommittedSize(v1::Storage::Stub* stub, const std::string& job,
                                            int64_t step, int32_t rank, uint64_t epoch = 0);

// Restores a whole shard into a string.
absl::StatusOr<std::string> RestoreToString(client::Client* c, const std::string& job,
                                            int64_t step, int32_t rank);

// The nodes of the static list `endpoints` in the remote client's placement order for
// (job, rank): RankEndpoints over the nodes' placement keys (their ids, asked by Health; when
// that fails, said on stderr, over the endpoints).
std::vector<size_t> PlacementOrder(const std::vector<std::string>& endpoints,
                                   const std::string& job, int32_t rank);

// A job name `prefix`N (N = 0..63) whose ranks 0 and 1 land on different nodes of `endpoints`
// under the static list's placement (one replica each), or "" when none does.
std::string JobWithRanksApart(const std::vector<std::string>& endpoints,
                              const std::string& prefix = "apart");

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_SERVICE_SERVICE_TEST_UTIL_H_
