#include "tests/service/service_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "client/backends.h"
#include "client/remote_placement.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/convert.h"

namespace gradsnap {
namespace testing {

absl::StatusOr<std::unique_ptr<client::Client>> StartAndConnect(
    ServerProcess* server, const std::string& data_dir, const std::vector<std::string>& flags) {
  RETURN_IF_ERROR(server->StartOn(data_dir, "127.0.0.1:0", flags));
  client::ClientOptions o;
  o.endpoints = {server->address()};
  return client::Client::ConnectRemote(o);
}

TestNode::TestNode(const std::vector<std::string>& flags) {
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      StartAndConnect(&server, dir.File("data"), flags);
  status = c.status();
  if (c.ok()) client = *std::move(c);
}

std::unique_ptr<client::Client> ConnectTo(const std::string& address, int max_attempts,
                                          int read_streams) {
  client::ClientOptions o;
  o.endpoints = {address};
  o.max_attempts = max_attempts;
  o.read_streams = read_streams;
  auto c = client::Client::ConnectRemote(o);
  return c.ok() ? *std::move(c) : nullptr;
}

absl::StatusOr<int> ConnectLoopback(int port, int recv_timeout_s) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{recv_timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int e = errno;
    close(fd);
    return PosixError(absl::StrCat("connect 127.0.0.1:", port), e);
  }
  return fd;
}

absl::StatusOr<std::string> HttpGet(int port) {
  ASSIGN_OR_RETURN(const int fd, ConnectLoopback(port, 5));
  const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) < 0) {
    close(fd);
    return absl::UnavailableError("send");
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.0 200", 0) != 0 || body == std::string::npos) {
    return absl::InternalError("bad HTTP response: " + resp.substr(0, 100));
  }
  return resp.substr(body + 4);
}

double MetricValue(const std::string& body, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.size() > name.size() && line.substr(0, name.size()) == name &&
        line[name.size()] == ' ') {
      double v = 0;
      if (absl::SimpleAtod(line.substr(name.size() + 1), &v)) return v;
    }
  }
  return -1;
}

absl::Status MakeTlsMaterial(const std::string& dir) {
  std::string d = dir;
  std::string script = absl::StrCat(
      "set -e; cd '", d, "';",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=gradsnap-test-ca "
      "-keyout ca.key -out ca.pem;",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
      "-keyout other-ca.key -out other-ca.pem;",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext;",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key "
      "-out server.csr;",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile san.ext -out server.pem;",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=trainer -keyout client.key "
      "-out client.csr;",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out client.pem", ") >/dev/null 2>&1");
  script = "(" + script;
  if (std::system(script.c_str()) != 0) return absl::InternalError("openssl failed");
  return absl::OkStatus();
}

std::vector<client::TensorRef> TestShard::Refs() const {
  std::vector<client::TensorRef> refs;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    refs.push_back(client::TensorRef{spec.tensors[i], data[i].data()});
  }
  return refs;
}

std::string TestShard::Payload() const {
  std::string all;
  for (const auto& d : data) all += d;
  return all;
}

TestShard MakeShard(const std::string& job, int64_t step, int32_t rank,
                    const std::vector<uint64_t>& tensor_bytes, uint64_t seed) {
  TestShard s;
  s.spec.job = job;
  s.spec.step = step;
  s.spec.rank = rank;
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(rank));
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    uint64_t n = tensor_bytes[i] / 4 * 4;
    storage::TensorSpec t;
    t.name = absl::StrCat("layer", i, ".weight");
    t.dtype = DType::kF32;
    t.shape = {static_cast<int64_t>(n / 4)};
    t.byte_length = n;
    std::string bytes(n, '\0');
    for (uint64_t k = 0; k + 8 <= n; k += 8) {
      uint64_t v = rng();
      std::memcpy(bytes.data() + k, &v, 8);
    }
    s.spec.tensors.push_back(t);
    s.data.push_back(std::move(bytes));
  }
  return s;
}

client::CheckpointSpec FullSpec(const std::string& job, int64_t step, int32_t world_size) {
  client::CheckpointSpec c;
  c.job = job;
  c.step = step;
  c.kind = client::CheckpointKind::kFull;
  c.base_step = -1;
  c.world_size = world_size;
  return c;
}

absl::StatusOr<std::unique_ptr<client::Client>> ConnectCluster(const std::string& etcd_endpoints) {
  client::ClientOptions o;
  o.etcd = etcd_endpoints;
  o.cluster_replicas = 3;
  o.min_replicas = 2;
  o.max_attempts = 3;
  o.rpc_timeout_ms = 10000;
  return client::Client::ConnectRemote(o);
}

absl::StatusOr<TestShard> SaveOneRank(client::Client* c, const std::string& job, int64_t step,
                                      uint64_t epoch, uint64_t seed) {
  client::CheckpointSpec spec = FullSpec(job, step, 1);
  spec.epoch = epoch;
  RETURN_IF_ERROR(c->BeginCheckpoint(spec));
  TestShard shard = MakeShard(job, step, 0, {1 << 20}, seed);
  shard.spec.epoch = epoch;
  RETURN_IF_ERROR(c->SaveShard(shard.spec, shard.Refs()));
  return shard;
}

std::unique_ptr<v1::Storage::Stub> RawStub(const std::string& address) {
  return v1::Storage::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

absl::StatusOr<uint64_t> QueryCommittedSize(v1::Storage::Stub* stub, const std::string& job,
                                            int64_t step, int32_t rank, uint64_t epoch) {
  v1::QueryWriteStatusRequest q;
  q.set_job(job);
  q.set_step(step);
  q.set_rank(rank);
  q.set_epoch(epoch);
  v1::QueryWriteStatusResponse r;
  grpc::ClientContext ctx;
  const grpc::Status s = stub->QueryWriteStatus(&ctx, q, &r);
  if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return r.committed_size();
}

absl::StatusOr<std::string> RestoreToString(client::Client* c, const std::string& job,
                                            int64_t step, int32_t rank) {
  std::string out;
  RETURN_IF_ERROR(c->RestoreShard(job, step, rank, [&](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return absl::OkStatus();
  }));
  return out;
}

bool SendRawPrefix(grpc::ClientWriter<v1::WriteRequest>* stream, const TestShard& shard,
                   uint64_t bytes) {
  v1::WriteRequest msg;
  proto::ToProto(shard.spec, msg.mutable_shard());
  for (uint64_t off = 0; off < bytes; off += 1 << 20) {
    msg.set_write_offset(off);
    msg.set_data(shard.data[0].substr(off, std::min<uint64_t>(1 << 20, bytes - off)));
    if (!stream->Write(msg)) return false;
    msg.clear_shard();
  }
  return true;
}

std::vector<size_t> PlacementOrder(const std::vector<std::string>& endpoints,
                                   const std::string& job, int32_t rank) {
  client::ClientOptions o;
  o.endpoints = endpoints;
  auto keys = client::StaticPlacementKeys(o);
  if (!keys.ok()) {  // said here; the caller's checks of what the nodes hold then fail
    std::fprintf(stderr, "placement keys of %s: %s\n", absl::StrJoin(endpoints, ",").c_str(),
                 keys.status().ToString().c_str());
    return client::RankEndpoints(endpoints, job, rank);
  }
  return client::RankEndpoints(*keys, job, rank);
}

std::string JobWithRanksApart(const std::vector<std::string>& endpoints,
                              const std::string& prefix) {
  client::ClientOptions o;
  o.endpoints = endpoints;
  auto keys = client::StaticPlacementKeys(o);
  if (!keys.ok()) return "";
  for (int i = 0; i < 64; ++i) {
    const std::string job = prefix + std::to_string(i);
    if (client::RankEndpoints(*keys, job, 0)[0] != client::RankEndpoints(*keys, job, 1)[0]) {
      return job;
    }
  }
  return "";
}

}  // namespace testing
}  // namespace gradsnap
