// Hostile input against a real gradsnap-server: a raw gRPC client (generic stub, raw bytes)
// sends garbage and malformed messages to every method, and a raw TCP client sends junk, while
// a well-behaved client saves and restores at the same time. Every bad call gets an error; the
// good client succeeds throughout and the server stays healthy.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/backends.h"
#include "client/client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "proto/gradsnap.pb.h"
#include "tests/service/service_test_util.h"

namespace gradsnap {
namespace testing {
namespace {

namespace v1 = ::gradsnap::v1;

struct RawResult {
  grpc::Status status;
  std::vector<std::string> responses;
};

// One call of `method` ("/gradsnap.v1.Storage/Write") sending raw message bytes, whatever the
// method's declared shape.
RawResult RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                  const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  RawResult result;
  void* tag;
  bool ok = false;
  auto call = stub.PrepareCall(&ctx, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  for (const std::string& m : messages) {
    if (!ok) break;
    grpc::Slice slice(m);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  for (int i = 0; i < 100000; ++i) {
    grpc::ByteBuffer r;
    call->Read(&r, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
    std::vector<grpc::Slice> slices;
    (void)r.Dump(&slices);
    std::string s;
    for (auto& sl : slices) s.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    result.responses.push_back(std::move(s));
  }
  call->Finish(&result.status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return result;
}

std::string Ser(const google::protobuf::Message& m) { return m.SerializeAsString(); }

v1::ShardSpec GoodSpec(const std::string& job, int64_t step, uint64_t bytes) {
  v1::ShardSpec s;
  s.set_job(job);
  s.set_step(step);
  s.set_rank(0);
  auto* t = s.add_tensors();
  t->set_name("w");
  t->set_dtype(v1::DTYPE_U8);
  t->add_shape(static_cast<int64_t>(bytes));
  t->set_byte_length(bytes);
  return s;
}

v1::WriteRequest WriteMsg(const v1::ShardSpec* spec, uint64_t offset, size_t n, bool finish) {
  v1::WriteRequest w;
  if (spec) *w.mutable_shard() = *spec;
  w.set_write_offset(offset);
  w.set_data(std::string(n, 'x'));
  w.set_finish_write(finish);
  return w;
}

// Every malformed call: {method, messages}.
std::vector<std::pair<std::string, std::vector<std::string>>> MalformedCalls() {
  const std::string p = "/gradsnap.v1.Storage/";
  std::vector<std::pair<std::string, std::vector<std::string>>> calls;
  auto begin = [&](auto edit) {
    v1::BeginCheckpointRequest r;
    auto* s = r.mutable_spec();
    s->set_job("hostile");
    s->set_step(1);
    s->set_kind(v1::CHECKPOINT_KIND_FULL);
    s->set_base_step(-1);
    s->set_world_size(1);
    edit(s);
    calls.push_back({p + "BeginCheckpoint", {Ser(r)}});
  };
  begin([](v1::CheckpointSpec* s) { s->set_kind(static_cast<v1::CheckpointKind>(99)); });
  begin([](v1::CheckpointSpec* s) { s->set_world_size(0); });
  begin([](v1::CheckpointSpec* s) { s->set_world_size(1 << 30); });
  begin([](v1::CheckpointSpec* s) { s->set_job("../../etc"); });
  begin([](v1::CheckpointSpec* s) { s->set_step(-5); });
  begin([](v1::CheckpointSpec* s) { s->set_base_step(7); });
  begin([](v1::CheckpointSpec* s) { s->set_metadata(std::string(2 << 20, 'm')); });
  // Write: every rule of the stream.
  v1::ShardSpec spec = GoodSpec("hostile", 1, 3 << 20);
  auto bad_tensor = [&](auto edit) {
    v1::ShardSpec s = spec;
    edit(s.mutable_tensors(0));
    calls.push_back({p + "Write", {Ser(WriteMsg(&s, 0, 10, false))}});
  };
  bad_tensor([](v1::TensorSpec* t) { t->set_dtype(static_cast<v1::DType>(42)); });
  bad_tensor([](v1::TensorSpec* t) { t->set_byte_length(5); });
  bad_tensor([](v1::TensorSpec* t) { t->set_shape(0, -1); });
  bad_tensor([](v1::TensorSpec* t) { t->set_name("a/b"); });
  bad_tensor([](v1::TensorSpec* t) { t->set_sha256("XYZ"); });
  bad_tensor([](v1::TensorSpec* t) {
    t->clear_shape();
    for (int i = 0; i < 40; ++i) t->add_shape(1 << 20);
  });
  calls.push_back({p + "Write", {}});
  calls.push_back({p + "Write", {Ser(WriteMsg(nullptr, 0, 10, false))}});
  calls.push_back({p + "Write", {Ser(WriteMsg(&spec, 0, 2 << 20, false))}});
  calls.push_back({p + "Write", {Ser(WriteMsg(&spec, 1ull << 50, 10, false))}});
  calls.push_back({p + "Write", {Ser(WriteMsg(&spec, 0, 10, false)),
                                 Ser(WriteMsg(&spec, 10, 10, false))}});
  calls.push_back({p + "Write", {Ser(WriteMsg(&spec, 0, 10, false)),
                                 Ser(WriteMsg(nullptr, 5, 10, false))}});
  calls.push_back({p + "Write", {Ser(WriteMsg(&spec, 0, 10, true))}});
  v1::ShardSpec tiny = GoodSpec("hostile", 1, 4);
  calls.push_back({p + "Write", {Ser(WriteMsg(&tiny, 0, 100, true))}});
  v1::ShardSpec many = spec;
  for (int i = 0; i < 100001; ++i) *many.add_tensors() = spec.tensors(0);
  calls.push_back({p + "Write", {Ser(WriteMsg(&many, 0, 0, false))}});
  // A message over the 4 MiB limit.
  calls.push_back({p + "Write", {Ser(WriteMsg(&spec, 0, 5 << 20, false))}});
  // Unary reads with bad fields.
  v1::ReadRequest read;
  read.set_job("hostile");
  read.set_rank(-1);
  calls.push_back({p + "Read", {Ser(read)}});
  read.set_rank(0);
  read.set_step(-1);
  calls.push_back({p + "Read", {Ser(read)}});
  read.set_step(1);
  read.set_job("");
  calls.push_back({p + "Read", {Ser(read)}});
  v1::QueryWriteStatusRequest q;
  q.set_job("hostile");
  q.set_rank(70000);
  calls.push_back({p + "QueryWriteStatus", {Ser(q)}});
  v1::GcRequest gc;
  gc.set_job("hostile");
  gc.set_keep_last(-5);
  calls.push_back({p + "Gc", {Ser(gc)}});
  v1::ListCheckpointsRequest lc;
  lc.set_job(std::string(4000, 'j'));
  calls.push_back({p + "ListCheckpoints", {Ser(lc)}});
  for (const char* m : {"GetManifest", "Verify", "Delete", "AbortCheckpoint"}) {
    v1::DeleteRequest d;  // same field numbers as the other (job, step) requests
    d.set_job("..");
    d.set_step(1);
    calls.push_back({p + m, {Ser(d)}});
  }
  calls.push_back({p + "NoSuchMethod", {"x"}});
  return calls;
}

std::vector<std::string> AllMethods() {
  return {"Health", "BeginCheckpoint", "AbortCheckpoint", "Write", "QueryWriteStatus", "Read",
          "ListJobs", "ListCheckpoints", "GetManifest", "Verify", "Delete", "Gc"};
}

// Junk straight onto the TCP port: random bytes, a truncated HTTP/2 preface, an HTTP/1 request.
void TcpJunk(int port, std::mt19937_64* rng) {
  std::vector<std::string> payloads = {"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                                       "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04"};
  std::string random(4096, '\0');
  for (auto& c : random) c = static_cast<char>((*rng)());
  payloads.push_back(random);
  payloads.push_back(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + random);
  for (const auto& p : payloads) {
    absl::StatusOr<int> fd = ConnectLoopback(port, 2);
    if (!fd.ok()) continue;  // the server's health is checked after the barrage
    (void)!send(*fd, p.data(), p.size(), MSG_NOSIGNAL);
    char buf[1024];
    (void)!recv(*fd, buf, sizeof(buf), 0);
    close(*fd);
  }
}

TEST(ServiceHostile, GarbageAndMalformedCallsWhileAGoodClientWorks) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir.File("data"), "127.0.0.1:0", {"--cache-bytes", "16000000"}).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> good_rounds{0};
  std::string good_error;
  std::thread good([&] {
    client::ClientOptions o;
    o.endpoints = {server.address()};
    auto c = client::NewRemoteClient(o);
    if (!c.ok()) {
      good_error = c.status().ToString();
      return;
    }
    for (int step = 0; step < 1000 && (!stop || step < 3); ++step) {
      TestShard s = MakeShard("good-job", step, 0, {2 << 20, 1000}, step);
      absl::Status st = (*c)->BeginCheckpoint(FullSpec("good-job", step, 1));
      if (st.ok()) st = (*c)->SaveShard(s.spec, s.Refs());
      auto got = st.ok() ? RestoreToString(c->get(), "good-job", step, 0)
                         : absl::StatusOr<std::string>(st);
      if (!got.ok() || *got != s.Payload()) {
        good_error = got.ok() ? "restored bytes differ" : got.status().ToString();
        return;
      }
      ++good_rounds;
    }
  });

  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  // A begun (never completable: world_size 2) checkpoint, so malformed uploads reach the
  // stream checks rather than stopping at NOT_FOUND.
  {
    v1::BeginCheckpointRequest r;
    r.mutable_spec()->set_job("hostile");
    r.mutable_spec()->set_step(1);
    r.mutable_spec()->set_kind(v1::CHECKPOINT_KIND_FULL);
    r.mutable_spec()->set_base_step(-1);
    r.mutable_spec()->set_world_size(2);
    RawResult begun = RawCall(channel, "/gradsnap.v1.Storage/BeginCheckpoint", {Ser(r)});
    ASSERT_TRUE(begun.status.ok()) << begun.status.error_message();
  }
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 2; ++round) {
    // Garbage bytes where every method expects a message.
    for (const std::string& m : AllMethods()) {
      for (size_t len : {1, 7, 300, 70000}) {
        std::string junk(len, '\0');
        for (auto& c : junk) c = static_cast<char>(rng());
        RawResult r = RawCall(channel, "/gradsnap.v1.Storage/" + m, {junk, junk});
        if (m != "Health" && m != "ListJobs") {
          EXPECT_FALSE(r.status.ok()) << m << " accepted " << len << " garbage bytes";
        }
      }
    }
    for (const auto& [method, messages] : MalformedCalls()) {
      RawResult r = RawCall(channel, method, messages);
      EXPECT_FALSE(r.status.ok()) << method << " accepted a malformed request";
      EXPECT_NE(r.status.error_code(), grpc::StatusCode::UNKNOWN) << method;
      EXPECT_NE(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << method;
    }
    TcpJunk(server.port(), &rng);
  }
  // Spot checks of the codes the protocol promises.
  auto calls = MalformedCalls();
  EXPECT_EQ(RawCall(channel, calls[0].first, calls[0].second).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::ShardSpec spec = GoodSpec("hostile", 1, 3 << 20);
  EXPECT_EQ(RawCall(channel, "/gradsnap.v1.Storage/Write",
                    {Ser(WriteMsg(&spec, 1ull << 50, 10, false))})
                .status.error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  stop = true;
  good.join();
  EXPECT_EQ(good_error, "");
  EXPECT_GE(good_rounds.load(), 3);
  // Still serving, nothing from the hostile job listed.
  RawResult health = RawCall(channel, "/gradsnap.v1.Storage/Health", {Ser(v1::HealthRequest())});
  EXPECT_TRUE(health.status.ok()) << health.status.error_message();
  client::ClientOptions o;
  o.endpoints = {server.address()};
  auto c = client::NewRemoteClient(o);
  ASSERT_TRUE(c.ok());
  auto listed = (*c)->List("hostile");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  c->reset();
  channel.reset();  // idle open connections delay a graceful shutdown by seconds
  EXPECT_EQ(server.Stop(), 0) << server.Log();
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
