// The service's zero-copy data path (docs/protocol.md, "Zero-copy framing", "Parallel
// restore"): reads served from the RAM tier and from disk are bit-exact, a restore over several
// parallel Read streams equals a single-stream one, every buffer handed to gRPC is released, and
// a server killed in the middle of a restore gives the client a clear error.
#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/backends.h"
#include "client/client.h"
#include "common/stats.h"
#include "gtest/gtest.h"
#include "proto/raw_message.h"
#include "service/server.h"
#include "tests/service/service_test_util.h"

namespace gradsnap {
namespace testing {
namespace {

// Tensors of odd sizes spanning several 16 MiB restore ranges and 1 MiB messages.
const std::vector<uint64_t> kTensors = {(20u << 20) + 3, 1, 777777, (17u << 20) + 5, 0, 4096};

// Every way of reading a shard back returns exactly `want`.
void ExpectReadsEqual(const std::string& address, const TestShard& s, const std::string& want) {
  for (int streams : {1, 3}) {
    std::unique_ptr<client::Client> c = ConnectTo(address, 8, streams);
    ASSERT_NE(c, nullptr);
    auto whole = RestoreToString(c.get(), s.spec.job, s.spec.step, s.spec.rank);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_TRUE(*whole == want) << "RestoreShard with " << streams << " streams differs";
    // A range that starts and ends inside tensors and spans several restore ranges.
    const uint64_t off = 12345, len = want.size() - 2 * off;
    std::string part(len, '\0');
    ASSERT_TRUE(
        c->ReadShardRange(s.spec.job, s.spec.step, s.spec.rank, off, len, part.data()).ok());
    EXPECT_TRUE(part == want.substr(off, len)) << "ReadShardRange with " << streams << " streams";
    // A range running past the payload is OUT_OF_RANGE, as documented, not a short read.
    std::string past(200, '\0');
    absl::Status ps = c->ReadShardRange(s.spec.job, s.spec.step, s.spec.rank, want.size() - 100,
                                        past.size(), past.data());
    EXPECT_EQ(ps.code(), absl::StatusCode::kOutOfRange) << ps;
    std::string t3(s.data[3].size(), '\0');
    ASSERT_TRUE(c->RestoreTensor(s.spec.job, s.spec.step, s.spec.rank, s.spec.tensors[3].name,
                                 t3.data(), t3.size())
                    .ok());
    EXPECT_TRUE(t3 == s.data[3]);
    // An empty tensor between others: nothing to read, and not the rest of the shard either.
    ASSERT_EQ(s.spec.tensors[4].byte_length, 0u);
    char none = 0;
    absl::Status empty =
        c->RestoreTensor(s.spec.job, s.spec.step, s.spec.rank, s.spec.tensors[4].name, &none, 0);
    EXPECT_TRUE(empty.ok()) << empty;
  }
}

// Waits (bounded) for gRPC to drop its last references; the count must reach zero.
int64_t OutstandingAfterCalls() {
  for (int i = 0; i < 500 && proto::OutstandingOwnedSlices() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return proto::OutstandingOwnedSlices();
}

// A server in this process on dir/data (127.0.0.1, a free port), without a RAM tier.
absl::StatusOr<std::unique_ptr<service::Server>> StartInProcess(const TempDir& dir) {
  service::ServerOptions so;
  so.engine.data_dir = dir.File("data");
  so.listen = "127.0.0.1:0";
  return service::Server::Start(so);
}

TEST(ServiceZeroCopy, RamTierAndDiskReadsAreExactAndReleaseTheirBuffers) {
  TempDir dir;
  service::ServerOptions so;
  so.engine.data_dir = dir.File("data");
  so.listen = "127.0.0.1:0";
  so.cache_bytes = 256u << 20;
  auto server = service::Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  TestShard s = MakeShard("zc", 1, 0, kTensors, 7);
  const std::string want = s.Payload();
  {
    std::unique_ptr<client::Client> c = ConnectTo((*server)->address(), 8, 1);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->BeginCheckpoint(FullSpec("zc", 1, 1)).ok());
    ASSERT_TRUE(c->SaveShard(s.spec, s.Refs()).ok());
  }
  EXPECT_EQ(proto::OutstandingOwnedSlices(), 0);  // nothing lent to gRPC before any Read
  Counter* hits = Registry::Global()->GetCounter("gradsnap_cache_hits_total", "");
  const int64_t hits_before = hits->Value();
  ExpectReadsEqual((*server)->address(), s, want);  // from the RAM tier
  EXPECT_GT(hits->Value(), hits_before);
  EXPECT_EQ(OutstandingAfterCalls(), 0);
  (*server)->Shutdown(absl::Seconds(5));
  server->reset();

  so.cache_bytes = 0;  // the same data from disk: the engine decodes into pooled buffers
  auto disk = service::Server::Start(so);
  ASSERT_TRUE(disk.ok()) << disk.status();
  ExpectReadsEqual((*disk)->address(), s, want);
  EXPECT_EQ(OutstandingAfterCalls(), 0);
  (*disk)->Shutdown(absl::Seconds(5));
}

TEST(ServiceZeroCopy, ParallelRestoreOfAnEmptyAndATinyShard) {
  TempDir dir;
  auto server = StartInProcess(dir);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> c = ConnectTo((*server)->address(), 8, 4);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("small", 1, 2)).ok());
  TestShard empty = MakeShard("small", 1, 0, {0}, 1);
  TestShard tiny = MakeShard("small", 1, 1, {5}, 2);
  ASSERT_TRUE(c->SaveShard(empty.spec, empty.Refs()).ok());
  ASSERT_TRUE(c->SaveShard(tiny.spec, tiny.Refs()).ok());
  auto e = RestoreToString(c.get(), "small", 1, 0);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, "");
  auto t = RestoreToString(c.get(), "small", 1, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, tiny.Payload());
  (*server)->Shutdown(absl::Seconds(5));
}

// Restoring the ranks of a checkpoint one after another over parallel streams fetches its
// manifest once (the only unary call), and a checkpoint saved again under the same step with
// another layout by a second client is still restored exactly.
TEST(ServiceZeroCopy, ParallelRestoreFetchesTheManifestOncePerCheckpoint) {
  TempDir dir;
  auto server = StartInProcess(dir);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  auto save = [&](uint64_t seed, const std::vector<uint64_t>& tensors) {
    std::vector<std::string> want;
    std::unique_ptr<client::Client> c = ConnectTo(address, 8, 1);
    EXPECT_TRUE(c->BeginCheckpoint(FullSpec("once", 1, 3)).ok());
    for (int32_t r = 0; r < 3; ++r) {
      TestShard s = MakeShard("once", 1, r, tensors, seed + r);
      EXPECT_TRUE(c->SaveShard(s.spec, s.Refs()).ok());
      want.push_back(s.Payload());
    }
    return want;
  };
  std::vector<std::string> want = save(10, kTensors);
  std::unique_ptr<client::Client> c = ConnectTo(address, 8, 4);
  ASSERT_NE(c, nullptr);
  Histogram* unary = Registry::Global()->GetHistogram("gradsnap_unary_seconds", "");
  const int64_t before = unary->Count();
  for (int32_t r = 0; r < 3; ++r) {
    auto got = RestoreToString(c.get(), "once", 1, r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == want[r]) << r;
  }
  EXPECT_EQ(unary->Count() - before, 1);
  // Verify's progress counts the payload bytes of the node (one manifest page, one Verify).
  uint64_t done = 0, total = 0;
  ASSERT_TRUE(c->Verify("once", 1, [&](uint64_t d, uint64_t t) { done = d, total = t; }).ok());
  EXPECT_EQ(done, want[0].size() + want[1].size() + want[2].size());
  EXPECT_EQ(total, done);
  EXPECT_EQ(unary->Count() - before, 3);

  std::unique_ptr<client::Client> other = ConnectTo(address, 8, 1);
  ASSERT_TRUE(other->Delete("once", 1).ok());
  want = save(20, {(18u << 20) + 1, 5, (16u << 20) + 7});
  for (int32_t r = 0; r < 3; ++r) {
    auto got = RestoreToString(c.get(), "once", 1, r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == want[r]) << r;
  }
  (*server)->Shutdown(absl::Seconds(5));
}

TEST(ServiceZeroCopy, ServerKilledMidRestoreIsAClearError) {
  TempDir dir;
  TestShard s = MakeShard("kill", 1, 0, {64u << 20}, 3);
  for (int streams : {1, 4}) {
    ServerProcess server(GRADSNAP_SERVER_BIN);  // a fresh server on the same data each time
    ASSERT_TRUE(server.StartOn(dir.File("data")).ok());
    std::unique_ptr<client::Client> c = ConnectTo(server.address(), /*max_attempts=*/2, streams);
    ASSERT_NE(c, nullptr);
    if (streams == 1) {
      ASSERT_TRUE(c->BeginCheckpoint(FullSpec("kill", 1, 1)).ok());
      ASSERT_TRUE(c->SaveShard(s.spec, s.Refs()).ok());
    }
    uint64_t got = 0;
    bool killed = false;
    absl::Status st = c->RestoreShard("kill", 1, 0, [&](const void*, size_t n) {
      got += n;
      if (!killed && got >= (4u << 20)) {
        server.Signal(SIGKILL);
        server.Wait();
        killed = true;
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(killed) << streams;
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << streams << ": " << st;
    EXPECT_NE(st.message().find(server.address()), std::string::npos) << st;
    EXPECT_LT(got, s.Payload().size());
  }
}

// TCP connections to `port` in state ESTABLISHED, counted at their client ends (the remote
// port is the server's), from /proc/net/tcp and tcp6 (gRPC's sockets are often dual-stack).
int EstablishedTo(int port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state;
      f >> slot >> local >> remote >> state;
      const size_t colon = remote.find(':');
      if (colon == std::string::npos || state != "01") continue;
      if (std::stoi(remote.substr(colon + 1), nullptr, 16) == port) ++n;
    }
  }
  return n;
}

// ClientOptions::connections_per_node: uploads and Read streams take the node's connections in
// turn (bytes exact over each, RestoreShardLent too); 1 keeps everything on one; out-of-range
// values are refused.
TEST(ServiceZeroCopy, StreamsTakeTheNodesConnectionsInTurn) {
  TempDir dir;
  auto server = StartInProcess(dir);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  TestShard s = MakeShard("conn", 1, 0, {(3u << 20) + 1, 4096}, 11);
  const std::string want = s.Payload();
  for (int connections : {1, 3}) {
    SCOPED_TRACE(connections);
    client::ClientOptions o;
    o.endpoints = {address};
    o.connections_per_node = connections;
    auto c = client::Client::ConnectRemote(o);
    ASSERT_TRUE(c.ok()) << c.status();
    if (connections == 1) {
      ASSERT_TRUE((*c)->BeginCheckpoint(FullSpec("conn", 1, 1)).ok());
      ASSERT_TRUE((*c)->SaveShard(s.spec, s.Refs()).ok());
    }
    for (int i = 0; i < 4; ++i) {
      auto got = RestoreToString(c->get(), "conn", 1, 0);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == want) << i;
    }
    // The remote client cannot lend its pieces (they live in the received messages): a lent
    // restore hands them over with no hold, to be copied during the call.
    std::string lent;
    absl::Status ls = (*c)->RestoreShardLent(
        "conn", 1, 0, [&](const void* p, size_t n, std::shared_ptr<const void> hold) {
          EXPECT_EQ(hold, nullptr);
          lent.append(static_cast<const char*>(p), n);
          return absl::OkStatus();
        });
    ASSERT_TRUE(ls.ok()) << ls;
    EXPECT_TRUE(lent == want);
    EXPECT_EQ(EstablishedTo(port), connections);
    c->reset();
    for (int i = 0; i < 100 && EstablishedTo(port) != 0; ++i) {  // closed with the client
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  for (int bad : {0, 17}) {
    client::ClientOptions o;
    o.endpoints = {address};
    o.connections_per_node = bad;
    auto c = client::Client::ConnectRemote(o);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(c.status().message().find("connections_per_node"), std::string::npos);
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
