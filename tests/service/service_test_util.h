// Helpers for the service tests: a real gradsnap-server child process (readiness line, signals,
// resident memory, metrics scrape), temp directories, TLS material made with the openssl
// command line, and deterministic shard data.
//
// Not thread-safe per object; each test owns its helpers.
#ifndef GRADSNAP_TESTS_SERVICE_SERVICE_TEST_UTIL_H_
#define GRADSNAP_TESTS_SERVICE_SERVICE_TEST_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"

namespace gradsnap {
namespace testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A gradsnap-server child process.
class ServerProcess {
 public:
  ServerProcess() = default;
  ~ServerProcess();  // SIGKILLs a still-running child

  // Starts build/bin/gradsnap-server with `args` (e.g. {"--data-dir", d, "--listen",
  // "127.0.0.1:0"}) and waits up to 30 s for its readiness line.
  absl::Status Start(const std::vector<std::string>& args);
  // Sends a signal; Wait() reaps and returns the exit status (or 128 + signal).
  void Signal(int sig);
  int Wait();
  // "running", or how the child ended (reaps it), for failure messages.
  std::string Describe();
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // The --metrics-listen port the server logged at start (0 if none).
  int metrics_port() const;
  // VmRSS of the child in bytes (0 if unknown).
  uint64_t RssBytes() const;
  // The child's stderr so far (its log).
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  std::string address_;
  int port_ = 0;
  std::string log_path_;
};

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

// Restores a whole shard into a string.
absl::StatusOr<std::string> RestoreToString(client::Client* c, const std::string& job,
                                            int64_t step, int32_t rank);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_SERVICE_SERVICE_TEST_UTIL_H_
