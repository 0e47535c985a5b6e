// Security against a real gradsnap-server: TLS and mutual TLS, per-job bearer tokens (none,
// wrong, another job's) for reads, writes and listing, and path-traversal-looking names.
#include <fstream>
#include <chrono>
#include <thread>
#include <string>
#include <vector>

#include "client/backends.h"
#include "client/client.h"
#include "common/token.h"
#include "proto/gradsnap.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/gtest_util.h"

namespace gradsnap {
namespace testing {
namespace {

using client::ClientOptions;

constexpr char kSecret[] = "0123456789abcdef-test-secret";

std::unique_ptr<client::Client> Connect(ClientOptions o) {
  o.max_attempts = 2;
  o.rpc_timeout_ms = 10000;
  return ValueOrNull(client::NewRemoteClient(o));
}

// Saves a 1-rank checkpoint; the status of the first failing step.
absl::Status SaveOne(client::Client* c, const std::string& job, int64_t step) {
  absl::Status s = c->BeginCheckpoint(FullSpec(job, step, 1));
  if (!s.ok()) return s;
  TestShard shard = MakeShard(job, step, 0, {256 << 10, 100}, step);
  return c->SaveShard(shard.spec, shard.Refs());
}

class SecureServer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeTlsMaterial(dir_.path()).ok());
    std::ofstream(dir_.File("secret")) << kSecret << "\n";
  }
  // Starts `server` with TLS (server.pem, server.key) and `extra` flags; returns client options
  // for it that trust ca.pem.
  ClientOptions StartTls(ServerProcess* server, const std::vector<std::string>& extra) {
    std::vector<std::string> flags = {"--tls-cert", dir_.File("server.pem"), "--tls-key",
                                      dir_.File("server.key")};
    flags.insert(flags.end(), extra.begin(), extra.end());
    const absl::Status st = server->StartOn(dir_.File("data"), "127.0.0.1:0", flags);
    EXPECT_TRUE(st.ok()) << st;
    ClientOptions o;
    o.endpoints = {server->address()};
    o.tls.ca_file = dir_.File("ca.pem");
    return o;
  }
  TempDir dir_;
};

TEST_F(SecureServer, TlsAndTokens) {
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ClientOptions o = StartTls(&server, {"--auth-secret-file", dir_.File("secret")});
  ASSERT_TRUE(server.running());
  std::string token_a = *MintJobToken(kSecret, "job-a");
  std::string token_b = *MintJobToken(kSecret, "job-b");

  o.token = token_a;
  auto a = Connect(o);
  ASSERT_TRUE(a->Health().ok());
  ASSERT_TRUE(SaveOne(a.get(), "job-a", 1).ok());
  o.token = token_b;
  auto b = Connect(o);
  ASSERT_TRUE(SaveOne(b.get(), "job-b", 1).ok());

  // Job tokens list only their own job.
  auto jobs = a->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(*jobs, std::vector<std::string>{"job-a"});
  // Another job's token: PERMISSION_DENIED for reads, writes and listings.
  const auto kDenied = absl::StatusCode::kPermissionDenied;
  EXPECT_EQ(b->List("job-a").status().code(), kDenied);
  EXPECT_EQ(b->Show("job-a", 1).status().code(), kDenied);
  EXPECT_EQ(b->Verify("job-a", 1).code(), kDenied);
  EXPECT_EQ(RestoreToString(b.get(), "job-a", 1, 0).status().code(), kDenied);
  EXPECT_EQ(SaveOne(b.get(), "job-a", 2).code(), kDenied);
  TestShard shard = MakeShard("job-a", 1, 0, {1024}, 9);
  EXPECT_EQ(b->SaveShard(shard.spec, shard.Refs()).code(), kDenied);
  EXPECT_EQ(b->Delete("job-a", 1).code(), kDenied);
  EXPECT_EQ(b->Gc("job-a", {1, 0}).status().code(), kDenied);
  // A forged token of the right shape.
  o.token = "gs1." + std::string(64, 'a');
  auto forged = Connect(o);
  EXPECT_EQ(forged->List("job-a").status().code(), kDenied);
  EXPECT_TRUE(forged->ListJobs()->empty());
  // No token: UNAUTHENTICATED everywhere but Health.
  o.token.clear();
  auto anon = Connect(o);
  EXPECT_TRUE(anon->Health().ok());
  EXPECT_EQ(anon->ListJobs().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->List("job-a").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(RestoreToString(anon.get(), "job-a", 1, 0).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(SaveOne(anon.get(), "job-c", 1).code(), absl::StatusCode::kUnauthenticated);
  // Garbage in the token slot.
  o.token = "not a token";
  EXPECT_EQ(Connect(o)->List("job-a").status().code(), absl::StatusCode::kUnauthenticated);

  // The owner still reads its data, byte-identical.
  auto got = RestoreToString(a.get(), "job-a", 1, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == MakeShard("job-a", 1, 0, {256 << 10, 100}, 1).Payload());

  // Plaintext against a TLS server, and TLS with a CA that did not sign the server: no service.
  o.token = token_a;
  o.tls.ca_file.clear();
  EXPECT_EQ(Connect(o)->List("job-a").status().code(), absl::StatusCode::kUnavailable);
  o.tls.ca_file = dir_.File("other-ca.pem");
  EXPECT_EQ(Connect(o)->List("job-a").status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(SecureServer, MutualTls) {
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ClientOptions o = StartTls(&server, {"--tls-client-ca", dir_.File("ca.pem")});
  ASSERT_TRUE(server.running());
  // Without a client certificate the handshake fails.
  EXPECT_EQ(Connect(o)->Health().code(), absl::StatusCode::kUnavailable);
  o.tls.cert_file = dir_.File("client.pem");
  o.tls.key_file = dir_.File("client.key");
  auto c = Connect(o);
  ASSERT_TRUE(c->Health().ok());
  ASSERT_TRUE(SaveOne(c.get(), "mtls", 3).ok());
  EXPECT_TRUE(c->Verify("mtls", 3).ok());
}

// TLS files the client cannot use are refused when it connects, with the file named; no
// server is needed to get that far.
TEST_F(SecureServer, BadClientTlsFilesAreRefused) {
  std::ofstream(dir_.File("empty.pem")).flush();
  ClientOptions o;
  o.endpoints = {"127.0.0.1:1"};
  auto code_of = [&o](const std::string& want_in_message) {
    auto c = client::NewRemoteClient(o);
    EXPECT_FALSE(c.ok());
    if (c.ok()) return absl::StatusCode::kOk;
    EXPECT_NE(c.status().message().find(want_in_message), std::string::npos) << c.status();
    return c.status().code();
  };
  o.tls.ca_file = dir_.File("empty.pem");
  EXPECT_EQ(code_of("empty.pem is empty"), absl::StatusCode::kInvalidArgument);
  o.tls.ca_file = dir_.File("missing.pem");
  EXPECT_EQ(code_of("missing.pem"), absl::StatusCode::kNotFound);
  o.tls.ca_file = dir_.File("ca.pem");
  o.tls.cert_file = dir_.File("client.pem");
  EXPECT_EQ(code_of("go together"), absl::StatusCode::kInvalidArgument);
  o.tls.ca_file.clear();
  o.tls.key_file = dir_.File("client.key");
  EXPECT_EQ(code_of("needs tls.ca_file"), absl::StatusCode::kInvalidArgument);
}

// Upload streams carrying a made-up token of the right shape, which then send nothing, hold no
// upload memory: the owner of a real token still saves, with the budget for one stream only.
TEST(ServiceSecurity, ForgedTokenStreamsHoldNoUploadBudget) {
  TempDir dir;
  std::ofstream(dir.File("secret")) << kSecret << "\n";
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server
                  .StartOn(dir.File("data"), "127.0.0.1:0",
                           {"--auth-secret-file", dir.File("secret"), "--max-inflight-bytes",
                            "50556928"})
                  .ok());
  auto stub = RawStub(server.address());
  constexpr int kSilent = 3;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<gradsnap::v1::WriteResponse> responses(kSilent);
  std::vector<std::unique_ptr<grpc::ClientWriter<gradsnap::v1::WriteRequest>>> silent;
  for (int i = 0; i < kSilent; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->AddMetadata("authorization", "Bearer gs1." + std::string(64, 'c'));
    silent.push_back(stub->Write(contexts.back().get(), &responses[i]));
  }
  ClientOptions o;
  o.endpoints = {server.address()};
  o.token = *MintJobToken(kSecret, "owner");
  auto owner = Connect(o);
  EXPECT_TRUE(SaveOne(owner.get(), "owner", 1).ok());
  for (auto& ctx : contexts) ctx->TryCancel();
  for (auto& w : silent) w->Finish().error_code();
  EXPECT_TRUE(owner->Health().ok());
}

// A client that opens an upload, sends its first message and then nothing, while answering
// keepalive pings (alive, silent), is cancelled after --stream-idle-ms: its share of a
// one-stream budget goes back, another upload gets through, and what it sent stays resumable.
// A server that cancels streams idle for 1 s, with upload and read budgets for one stream each.
class ServiceSecurityIdle : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(node.status.ok()) << node.status; }
  TestNode node{{"--stream-idle-ms", "1000", "--max-inflight-bytes", "50556928"}};
  client::Client* const c = node.client.get();
};

TEST_F(ServiceSecurityIdle, SilentUploadIsCancelledAfterTheIdleLimit) {
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("quiet", 1, 2)).ok());
  TestShard silent = MakeShard("quiet", 1, 0, {4u << 20}, 1);
  auto stub = RawStub(node.server.address());
  grpc::ClientContext ctx;  // no deadline: only the server can end it
  gradsnap::v1::WriteResponse resp;
  auto stream = stub->Write(&ctx, &resp);
  ASSERT_TRUE(SendRawPrefix(stream.get(), silent, 1 << 20));
  // Rank 1 needs the one stream's budget the silent one holds (5 s of "server busy" a try).
  TestShard other = MakeShard("quiet", 1, 1, {1u << 20}, 2);
  absl::Status saved = c->SaveShard(other.spec, other.Refs());
  EXPECT_TRUE(saved.ok()) << saved << "\n" << node.server.Log();
  grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::CANCELLED) << ended.error_message();
  // The silent stream's bytes stay resumable: the server flushes them as it tears the
  // cancelled stream down, which may end after the client saw CANCELLED (bounded wait).
  absl::StatusOr<uint64_t> resumable;
  for (int i = 0; i < 100; ++i) {
    resumable = QueryCommittedSize(stub.get(), "quiet", 1, 0);
    ASSERT_TRUE(resumable.ok()) << resumable.status();
    if (*resumable == 1u << 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(*resumable, 1u << 20);
}

// A download whose client takes the first message and then no more (flow control holds the
// server's writes; the client answers pings) is cancelled after --stream-idle-ms: the read
// budget it held (all of it here) goes back and another restore gets through.
TEST_F(ServiceSecurityIdle, StalledDownloadIsCancelledAfterTheIdleLimit) {
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("stall", 1, 2)).ok());
  TestShard big = MakeShard("stall", 1, 0, {96u << 20}, 1);
  TestShard small = MakeShard("stall", 1, 1, {1u << 20}, 2);
  ASSERT_TRUE(c->SaveShard(big.spec, big.Refs()).ok());
  ASSERT_TRUE(c->SaveShard(small.spec, small.Refs()).ok());
  auto stub = RawStub(node.server.address());
  grpc::ClientContext ctx;  // no deadline: only the server can end it
  gradsnap::v1::ReadRequest req;
  req.set_job("stall");
  req.set_step(1);
  req.set_rank(0);
  auto reader = stub->Read(&ctx, req);
  gradsnap::v1::ReadResponse first;
  ASSERT_TRUE(reader->Read(&first));  // then takes nothing more
  auto got = RestoreToString(c, "stall", 1, 1);
  ASSERT_TRUE(got.ok()) << got.status() << "\n" << node.server.Log();
  EXPECT_TRUE(*got == small.Payload());
  ctx.TryCancel();
  gradsnap::v1::ReadResponse rest;
  while (reader->Read(&rest)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
}

TEST(ServiceSecurity, PathTraversalNamesAreRejected) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir.File("data")).ok());
  ClientOptions o;
  o.endpoints = {server.address()};
  auto c = Connect(o);
  const auto kBad = absl::StatusCode::kInvalidArgument;
  const std::vector<std::string> kJobs = {"..", ".", "../etc", "a/b", "/abs", "x\\y", "",
                                          std::string(129, 'j'), std::string("nul\0byte", 8),
                                          "sp ace"};
  for (const std::string& job : kJobs) {
    EXPECT_EQ(c->BeginCheckpoint(FullSpec(job, 1, 1)).code(), kBad) << job;
    EXPECT_EQ(c->List(job).status().code(), kBad) << job;
    EXPECT_EQ(c->Show(job, 1).status().code(), kBad) << job;
    EXPECT_EQ(RestoreToString(c.get(), job, 1, 0).status().code(), kBad) << job;
    EXPECT_EQ(c->Delete(job, 1).code(), kBad) << job;
  }
  // A good job with a traversal tensor name.
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("good", 1, 1)).ok());
  TestShard shard = MakeShard("good", 1, 0, {1024}, 1);
  shard.spec.tensors[0].name = "../../etc/passwd";
  EXPECT_EQ(c->SaveShard(shard.spec, shard.Refs()).code(), kBad);
  // Nothing escaped the data directory, and the server still serves.
  EXPECT_TRUE(c->Health().ok());
  auto jobs = c->ListJobs();
  ASSERT_TRUE(jobs.ok());
  for (const auto& j : *jobs) EXPECT_EQ(j, "good");
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
