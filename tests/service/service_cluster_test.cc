// gradsnap-server in cluster mode (--etcd): real gradsnap-server processes and a real etcd
// (Debian's etcd-server) started by the test on loopback ports (docs/protocol.md, "Cluster
// mode"). Flag checks, etcd unreachable at start, registration under a lease, writes refused
// while the lease is gone and taken again once it is back.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/node_id.h"
#include "gtest/gtest.h"
#include "service_test_util.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

// Polls `cond` every 100 ms for up to `seconds` (what etcd and the lease do in their own time).
template <typename Cond>
bool WaitFor(Cond cond, int seconds) {
  for (int i = 0; i < seconds * 10; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return cond();
}

std::unique_ptr<cluster::EtcdClient> EtcdOf(const EtcdCluster& etcd) {
  cluster::EtcdOptions o;
  o.endpoints = *cluster::ParseEtcdEndpoints(etcd.Endpoints());
  o.rpc_timeout_ms = 2000;
  return *cluster::EtcdClient::Create(o);
}

TEST(ClusterServer, BadClusterFlagsExitTwoWithOneLine) {
  TempDir dir("cluster-flags");
  const std::vector<std::vector<std::string>> bad = {
      {"--etcd", "127.0.0.1:0", "--advertise", "127.0.0.1:7070"},
      {"--etcd", "nohost", "--advertise", "127.0.0.1:7070"},
      {"--etcd", "https://127.0.0.1:2379", "--advertise", "127.0.0.1:7070"},
      {"--etcd", "127.0.0.1:2379,,127.0.0.1:2380", "--advertise", "127.0.0.1:7070"},
      {"--etcd", "127.0.0.1:2379"},                             // no --advertise
      {"--advertise", "127.0.0.1:7070"},                        // no --etcd
      {"--etcd", "127.0.0.1:2379", "--advertise", "nowhere"},   // no port
      {"--etcd", "127.0.0.1:2379", "--advertise", "h:1", "--lease-ttl-s", "1"},
  };
  for (const auto& flags : bad) {
    std::vector<std::string> args = {"--data-dir", dir.File("data"), "--listen", "127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    RunResult r = RunProgram(GRADSNAP_SERVER_BIN, args, /*timeout_s=*/60);
    const std::string what = absl::StrCat(flags[0], " ", flags.size() > 1 ? flags[1] : "");
    EXPECT_EQ(r.exit_code, 2) << what << ": " << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << what << ": " << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap-server: ")) << r.err;
    EXPECT_EQ(r.out, "") << what;  // never ready
  }
}

TEST(ClusterServer, EtcdUnreachableAtStartIsOneClearLine) {
  TempDir dir("cluster-down");
  auto port = FreePort();
  ASSERT_TRUE(port.ok());
  RunResult r = RunProgram(GRADSNAP_SERVER_BIN,
                           {"--data-dir", dir.File("data"), "--listen", "127.0.0.1:0", "--etcd",
                            absl::StrCat("127.0.0.1:", *port), "--advertise", "127.0.0.1:7070"},
                           /*timeout_s=*/60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap-server: etcd unreachable")) << r.err;
  EXPECT_NE(r.err.find(absl::StrCat("127.0.0.1:", *port)), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  // Single-node mode on the same directory is unaffected.
  ServerProcess single(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(single.StartOn(dir.File("data")).ok()) << single.Log();
}

// One node in a 1-member etcd: its record appears under its lease with its stable id; with
// etcd gone it refuses writes (UNAVAILABLE) once its lease could have run out, while reads go
// on; with etcd back it takes writes again; a stop removes its record at once.
TEST(ClusterServer, RegistersUnderLeaseAndRefusesWritesWithoutIt) {
  TempDir dir("cluster-lease");
  EtcdCluster etcd(dir.Sub("etcd"));
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  auto port = FreePort();
  ASSERT_TRUE(port.ok());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server
                  .StartOn(dir.File("data"), address,
                           {"--etcd", "http://" + etcd.Endpoints(), "--advertise", address,
                            "--lease-ttl-s", "2"})
                  .ok())
      << server.Log();
  auto id_text = ReadFile(dir.File("data/node_id"));
  ASSERT_TRUE(id_text.ok()) << id_text.status();
  const std::string id(absl::StripSuffix(*id_text, "\n"));
  ASSERT_TRUE(cluster::IsValidNodeId(id)) << id;
  auto kv = EtcdOf(etcd)->Get(cluster::kNodesPrefix + id);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto rec = cluster::DecodeNodeRecord(*kv);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->address, address);
  EXPECT_GT(rec->capacity_bytes, 0u);
  EXPECT_NE(kv->lease, 0);

  auto c = ConnectTo(address, /*max_attempts=*/1);
  ASSERT_NE(c, nullptr);
  TestShard shard = MakeShard("lease-job", 1, 0, {1 << 20}, 7);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("lease-job", 1, 1)).ok());
  ASSERT_TRUE(c->SaveShard(shard.spec, shard.Refs()).ok());
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("lease-job", 2, 1)).ok());  // its upload comes later

  etcd.Kill(0);
  absl::Status refused;
  ASSERT_TRUE(WaitFor(
      [&] {
        refused = c->BeginCheckpoint(FullSpec("lease-job", 3, 1));
        return !refused.ok();
      },
      60))
      << server.Log();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("lease"), absl::string_view::npos) << refused;
  TestShard late = MakeShard("lease-job", 2, 0, {1 << 20}, 8);
  absl::Status upload = c->SaveShard(late.spec, late.Refs());
  EXPECT_EQ(upload.code(), absl::StatusCode::kUnavailable) << upload;
  // Reads are served without a lease.
  auto back = RestoreToString(c.get(), "lease-job", 1, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, shard.Payload());

  ASSERT_TRUE(etcd.Restart(0).ok()) << etcd.Log(0);
  absl::Status again;
  ASSERT_TRUE(WaitFor(
      [&] {
        again = c->BeginCheckpoint(FullSpec("lease-job", 3, 1));
        return again.ok();
      },
      60))
      << again << "\n" << server.Log();
  ASSERT_TRUE(WaitFor([&] { return EtcdOf(etcd)->Get(cluster::kNodesPrefix + id).ok(); }, 30));
  ASSERT_TRUE(c->SaveShard(late.spec, late.Refs()).ok());  // the refused upload goes through now
  auto restored = RestoreToString(c.get(), "lease-job", 2, 0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, late.Payload());

  // The id is kept across restarts; a stop revokes the lease and the record goes with it.
  ASSERT_EQ(server.Stop(), 0);
  EXPECT_EQ(EtcdOf(etcd)->Get(cluster::kNodesPrefix + id).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(server.Restart().ok()) << server.Log();
  EXPECT_EQ(*ReadFile(dir.File("data/node_id")), *id_text);
  auto again_kv = EtcdOf(etcd)->Get(cluster::kNodesPrefix + id);
  ASSERT_TRUE(again_kv.ok()) << again_kv.status();
  EXPECT_EQ(cluster::DecodeNodeRecord(*again_kv)->address, address);
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
