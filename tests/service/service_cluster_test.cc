// gradsnap-server in cluster mode (--etcd): real gradsnap-server processes and a real etcd
// (Debian's etcd-server) started by the test on loopback ports (docs/protocol.md, "Cluster
// mode"). Flag checks, etcd unreachable at start, registration under a lease, writes refused
// while the lease is gone and taken again once it is back.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/node_id.h"
#include "cluster/placement.h"
#include "gtest/gtest.h"
#include "service_test_util.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

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
      {"--etcd", "https://127.0.0.1:2379,127.0.0.1:2380", "--advertise", "127.0.0.1:7070"},
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
                            "--lease-ttl-s", "2", "--metrics-listen", "127.0.0.1:0"})
                  .ok())
      << server.Log();
  auto metric = [&](const char* name) {
    auto body = HttpGet(server.metrics_port());
    return body.ok() ? MetricValue(*body, name) : -2;
  };
  EXPECT_EQ(metric("gradsnap_cluster_lease_losses_total"), 0);
  EXPECT_EQ(metric("gradsnap_cluster_lease_live"), 1);
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
  // The loss is counted (by the keep-alive thread, at its next round after the TTL).
  EXPECT_TRUE(WaitFor([&] { return metric("gradsnap_cluster_lease_losses_total") == 1; }, 30))
      << server.Log();
  EXPECT_EQ(metric("gradsnap_cluster_lease_live"), 0);
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
  EXPECT_EQ(metric("gradsnap_cluster_lease_losses_total"), 1);
  EXPECT_EQ(metric("gradsnap_cluster_lease_live"), 1);
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

// A node's record in etcd follows its free space: space taken on its file system (fallocate, no
// data written) shows in the record's free_bytes within a few lease renewals, not only at the
// next registration.
TEST(ClusterServer, FreeBytesInEtcdFollowTheDisk) {
  TempDir dir("cluster-space");
  EtcdCluster etcd(dir.Sub("etcd"));
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  ServerProcess server(GRADSNAP_SERVER_BIN);
  auto address = StartClusterNode(&server, dir.File("data"), etcd.Endpoints(),
                                  {"--lease-ttl-s", "2"});
  ASSERT_TRUE(address.ok()) << address.status();
  const std::string id(absl::StripSuffix(*ReadFile(dir.File("data/node_id")), "\n"));
  auto record = [&]() -> absl::StatusOr<cluster::NodeRecord> {
    auto kv = EtcdOf(etcd)->Get(cluster::kNodesPrefix + id);
    if (!kv.ok()) return kv.status();
    return cluster::DecodeNodeRecord(*kv);
  };
  auto first = record();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT(first->free_bytes, 0u);
  // Four times the refresh threshold (0.1 % of the capacity, at least 64 MiB here), capped by
  // what is free.
  const uint64_t take = std::min<uint64_t>(
      std::max<uint64_t>(64u << 20, first->capacity_bytes / 250), first->free_bytes / 4);
  const int fd = ::open(dir.File("data/ballast").c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::posix_fallocate(fd, 0, static_cast<off_t>(take)), 0);
  ::close(fd);
  uint64_t seen = first->free_bytes;
  EXPECT_TRUE(WaitFor(
      [&] {
        auto r = record();
        if (r.ok()) seen = r->free_bytes;
        return r.ok() && r->free_bytes + take / 2 <= first->free_bytes;
      },
      60))
      << "registered with " << first->free_bytes << " free, " << take << " taken, record says "
      << seen << "\n" << server.Log();
  ::unlink(dir.File("data/ballast").c_str());
}

// A 3-member etcd and 4 storage nodes, R = 3, W = 2, all made by the test.
class ClusterE2E : public ::testing::Test {
 protected:
  static constexpr int kNodes = 4;
  void SetUp() override {
    ASSERT_TRUE(etcd_.Start(3).ok()) << etcd_.Log(0);
    for (int i = 0; i < kNodes; ++i) {
      data_.push_back(dir_.File(absl::StrCat("node", i)));
      servers_.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
      auto address = StartClusterNode(servers_.back().get(), data_.back(), etcd_.Endpoints(),
                                      {"--lease-ttl-s", "2"});
      ASSERT_TRUE(address.ok()) << address.status();
      ids_.push_back(std::string(absl::StripSuffix(*ReadFile(data_.back() + "/node_id"), "\n")));
    }
    // Every node is registered (each did before its readiness line): a client made now lists
    // them all.
    ASSERT_EQ(EtcdOf(etcd_)->GetPrefix(cluster::kNodesPrefix)->size(), size_t{kNodes});
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(client_->Health().ok());
  }

  std::unique_ptr<client::Client> Connect() {
    auto c = ConnectCluster(etcd_.Endpoints());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Begins (job, step) with one rank and saves a 1 MiB shard for it, which it returns.
  static TestShard SaveOneRank(client::Client* c, const std::string& job, int64_t step,
                               uint64_t epoch, uint64_t seed) {
    auto shard = testing::SaveOneRank(c, job, step, epoch, seed);
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? *std::move(shard) : TestShard{};
  }

  // Node indices in the rendezvous order of (job, rank) over all nodes.
  std::vector<int> Order(const std::string& job, int32_t rank) {
    std::vector<uint64_t> hashes;
    for (const auto& id : ids_) hashes.push_back(cluster::NodeHash(id));
    std::vector<int> out;
    for (size_t i : cluster::RankNodes(hashes, cluster::ShardKeyHash(job, rank), ids_.size())) {
      out.push_back(static_cast<int>(i));
    }
    return out;
  }

  TempDir dir_{"cluster-e2e"};
  EtcdCluster etcd_{dir_.Sub("etcd")};
  std::vector<std::string> data_;
  std::vector<std::string> ids_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(ClusterE2E, SavesSurviveANodeKilledMidUploadAndAnEtcdMemberLoss) {
  client::Client* c = client_.get();
  auto epoch = c->AcquireEpoch("cj");
  ASSERT_TRUE(epoch.ok()) << epoch.status();

  // Step 0, one rank: its 3 replicas are the first 3 nodes of its order; the 4th node gets
  // nothing of it (no placeholder, no data).
  SaveOneRank(c, "cj", 0, *epoch, 1);
  const std::vector<int> order0 = Order("cj", 0);
  for (int k = 0; k < kNodes; ++k) {
    EXPECT_EQ(SegmentFiles(data_[order0[k]], "cj.r0", 0).empty(), k >= 3) << "node " << k;
  }
  ASSERT_EQ(c->List("cj")->size(), 1u);

  // Step 1, two ranks: the first node of rank 0's order is SIGKILLed while rank 0 uploads (as
  // soon as its data appears there); the save still commits, with at least W copies.
  client::CheckpointSpec s1 = FullSpec("cj", 1, 2);
  s1.epoch = *epoch;
  ASSERT_TRUE(c->BeginCheckpoint(s1).ok());
  TestShard big = MakeShard("cj", 1, 0, {48u << 20}, 2);
  TestShard other = MakeShard("cj", 1, 1, {1 << 20}, 3);
  big.spec.epoch = other.spec.epoch = *epoch;
  const int victim = Order("cj", 0)[0];
  auto pending = c->SaveShardAsync(big.spec, big.Refs());
  WaitFor([&] { return !SegmentFiles(data_[victim], "cj.r0", 1).empty(); }, 30);
  const bool in_flight =
      pending.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  servers_[victim]->Kill();
  std::printf("node %d killed %s\n", victim,
              in_flight ? "while the save was in flight" : "after the save resolved");
  absl::Status saved = pending.get();
  ASSERT_TRUE(saved.ok()) << saved;
  ASSERT_TRUE(c->SaveShard(other.spec, other.Refs()).ok());
  auto listed = c->List("cj");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[1].raw_bytes, (48u << 20) + (1u << 20));  // true sizes: one copy each

  auto etcd = EtcdOf(etcd_);
  cluster::ClusterCatalog catalog(etcd.get());
  auto record = catalog.Get("cj", 1);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_GE(record->ranks.at(0).nodes.size(), 2u);
  auto back = RestoreToString(c, "cj", 1, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == big.Payload());
  auto back1 = RestoreToString(c, "cj", 1, 1);
  ASSERT_TRUE(back1.ok()) << back1.status();
  EXPECT_TRUE(*back1 == other.Payload());

  // An etcd member killed, the leader (the hard case: no write commits until a new leader is
  // elected, and with --lease-ttl-s 2 the nodes refuse writes meanwhile): nothing changes.
  const int leader = etcd_.Leader();
  ASSERT_GE(leader, 0);
  etcd_.Kill(leader);
  const TestShard third = SaveOneRank(c, "cj", 2, *epoch, 4);
  EXPECT_EQ(c->List("cj")->size(), 3u);
  auto back2 = RestoreToString(c, "cj", 2, 0);
  ASSERT_TRUE(back2.ok()) << back2.status();
  EXPECT_TRUE(*back2 == third.Payload());

  // The CLI in cluster mode: health, ls with true sizes, verify of every live copy.
  RunResult health = RunProgram(GRADSNAP_CLI_BIN, {"--etcd", etcd_.Endpoints(), "health"}, 60);
  EXPECT_EQ(health.exit_code, 0) << health.out << health.err;
  EXPECT_TRUE(absl::StartsWith(health.out, "ok: cluster on etcd ")) << health.out;
  RunResult ls = RunProgram(GRADSNAP_CLI_BIN, {"--etcd", etcd_.Endpoints(), "--json", "ls", "cj"}, 60);
  EXPECT_EQ(ls.exit_code, 0) << ls.out << ls.err;
  size_t committed = 0;
  for (size_t at = 0; (at = ls.out.find("\"state\":\"committed\"", at)) != std::string::npos; ++at) {
    ++committed;
  }
  EXPECT_EQ(committed, 3u) << ls.out;
  EXPECT_NE(ls.out.find(absl::StrCat((48u << 20) + (1u << 20))), std::string::npos) << ls.out;
  RunResult verify =
      RunProgram(GRADSNAP_CLI_BIN, {"--etcd", etcd_.Endpoints(), "verify", "cj", "--all"}, 120);
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

// 12 nodes, one checkpoint of 2 ranks saved and restored: only the nodes holding a copy see any
// call (their metrics count unary calls and Write and Read streams); the others see none.
TEST(ClusterScale, OnlyReplicasSeeRpcs) {
  constexpr int kNodes = 12;
  TempDir dir("cluster-12");
  EtcdCluster etcd(dir.Sub("etcd"));
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (int i = 0; i < kNodes; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
    auto address = StartClusterNode(
        servers.back().get(), dir.File(absl::StrCat("node", i)), etcd.Endpoints(),
        {"--metrics-listen", "127.0.0.1:0", "--prefault-uploads", "0",
         "--prefault-read-ahead=false"});
    ASSERT_TRUE(address.ok()) << address.status();
  }
  client::ClientOptions o;
  o.etcd = etcd.Endpoints();
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto epoch = (*c)->AcquireEpoch("wide");
  ASSERT_TRUE(epoch.ok());
  client::CheckpointSpec spec = FullSpec("wide", 3, 2);
  spec.epoch = *epoch;
  ASSERT_TRUE((*c)->BeginCheckpoint(spec).ok());
  std::vector<TestShard> shards;
  for (int32_t r = 0; r < 2; ++r) {
    shards.push_back(MakeShard("wide", 3, r, {1 << 20}, 10 + r));
    shards.back().spec.epoch = *epoch;
    ASSERT_TRUE((*c)->SaveShard(shards.back().spec, shards.back().Refs()).ok());
  }
  for (int32_t r = 0; r < 2; ++r) {
    auto back = RestoreToString(c->get(), "wide", 3, r);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == shards[r].Payload());
  }
  auto etcd_client = EtcdOf(etcd);
  cluster::ClusterCatalog catalog(etcd_client.get());
  auto record = catalog.Get("wide", 3);
  ASSERT_TRUE(record.ok()) << record.status();
  std::set<std::string> holders;
  for (const auto& [rank, r] : record->ranks) {
    EXPECT_EQ(r.nodes.size(), 3u);  // R = 3 by default
    holders.insert(r.nodes.begin(), r.nodes.end());
  }
  int idle = 0;
  for (int i = 0; i < kNodes; ++i) {
    const std::string id(
        absl::StripSuffix(*ReadFile(dir.File(absl::StrCat("node", i, "/node_id"))), "\n"));
    auto body = HttpGet(servers[i]->metrics_port());
    ASSERT_TRUE(body.ok()) << body.status();
    // A histogram never observed may be absent (-1): counted as 0.
    auto count = [&](const char* name) { return std::max(0.0, MetricValue(*body, name)); };
    const double calls = count("gradsnap_unary_seconds_count") +
                         count("gradsnap_write_seconds_count") + count("gradsnap_read_seconds_count");
    if (holders.count(id)) {
      EXPECT_GT(calls, 0) << "replica " << i;
    } else {
      EXPECT_EQ(calls, 0) << "node " << i << " holds nothing of the checkpoint";
      ++idle;
    }
  }
  EXPECT_GE(idle, kNodes - 6);
}

TEST(ClusterCli, ClusterFlagsAreCheckedAsUsage) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--min-replicas", "2", "ls"},
           {"--etcd", "127.0.0.1:2379", "--server", "127.0.0.1:7070", "ls"},
           {"--etcd", "127.0.0.1:0", "ls"},
           {"--etcd", "127.0.0.1:2379", "--min-replicas", "0", "ls"}}) {
    RunResult r = RunProgram(GRADSNAP_CLI_BIN, args, 60);
    EXPECT_EQ(r.exit_code, 2) << args[0] << " " << args[1] << ": " << r.out << r.err;
  }
}

// A zombie of an older attempt, which began its checkpoint before the new attempt took its
// epoch, uploads its shard to the nodes but can never commit it: nothing of it is listed.
// A node frozen (SIGSTOP: its connections stay open, its lease still valid) while a save
// places a copy on it: the save does not wait for that copy's RPC deadline (a minute here) once
// W = 2 copies are durable; it cancels the straggler and stages the rank with the two it has,
// and the checkpoint restores exactly. The next save places on the other nodes (suspicion).
TEST_F(ClusterE2E, FrozenReplicaDoesNotHoldASaveOnceWCopiesAreDurable) {
  client::ClientOptions o;
  o.etcd = etcd_.Endpoints();
  o.cluster_replicas = 3;
  o.min_replicas = 2;
  o.max_attempts = 3;
  constexpr int kDeadlineMs = 60000;
  o.rpc_timeout_ms = kDeadlineMs;
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto epoch = (*c)->AcquireEpoch("fz");
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  const std::vector<int> order = Order("fz", 0);
  const int frozen = order[2];  // the third copy's node
  ASSERT_EQ(::kill(servers_[frozen]->pid(), SIGSTOP), 0);
  const absl::Time start = absl::Now();
  const TestShard shard = SaveOneRank(c->get(), "fz", 0, *epoch, 21);
  const absl::Duration took = absl::Now() - start;
  // The next save, the node still frozen: the client suspects it (its copy was cancelled), so
  // the copies go to the next node in order instead, all three made.
  const TestShard next = SaveOneRank(c->get(), "fz", 1, *epoch, 22);
  ASSERT_EQ(::kill(servers_[frozen]->pid(), SIGCONT), 0);
  EXPECT_LT(took, absl::Milliseconds(kDeadlineMs)) << "the save waited for the frozen node";
  auto etcd = EtcdOf(etcd_);
  cluster::ClusterCatalog catalog(etcd.get());
  auto record = catalog.Get("fz", 0);
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_EQ(record->state, client::CheckpointState::kCommitted);
  const std::vector<std::string>& nodes = record->ranks.at(0).nodes;
  EXPECT_EQ(nodes, (std::vector<std::string>{ids_[order[0]], ids_[order[1]]}));
  auto back = RestoreToString(c->get(), "fz", 0, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == shard.Payload());
  auto second = catalog.Get("fz", 1);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->state, client::CheckpointState::kCommitted);
  const std::vector<std::string>& placed = second->ranks.at(0).nodes;
  EXPECT_EQ(std::count(placed.begin(), placed.end(), ids_[frozen]), 0)
      << "the suspected node was placed on again: " << absl::StrJoin(placed, ",");
  EXPECT_EQ(std::count(placed.begin(), placed.end(), ids_[order[3]]), 1)
      << "the next node in order took no copy: " << absl::StrJoin(placed, ",");
  back = RestoreToString(c->get(), "fz", 1, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == next.Payload());
}

// A restore describes a checkpoint (Show), then reads its ranges: the reads go to the replicas
// the record named without asking etcd for it again (one quorum read per range before), so
// they go on while etcd has lost its quorum.
TEST_F(ClusterE2E, ReadsAfterShowNeedNoEtcdRoundTrip) {
  auto epoch = client_->AcquireEpoch("rj");
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  const TestShard a = SaveOneRank(client_.get(), "rj", 0, *epoch, 11);
  auto shown = client_->Show("rj", 0);
  ASSERT_TRUE(shown.ok()) << shown.status();
  etcd_.Kill(1);
  etcd_.Kill(2);  // one member of three left: no quorum
  std::string range(4096, '\0');
  absl::Status read = client_->ReadShardRange("rj", 0, 0, 1000, range.size(), range.data());
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(range, a.Payload().substr(1000, range.size()));
  auto whole = RestoreToString(client_.get(), "rj", 0, 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(*whole == a.Payload());
  // Quorum back, so the nodes' shutdown can revoke their leases.
  ASSERT_TRUE(etcd_.Restart(1).ok());
  ASSERT_TRUE(etcd_.Restart(2).ok());
}

TEST_F(ClusterE2E, ZombieAttemptIsFencedAcrossNodes) {
  auto old_epoch = client_->AcquireEpoch("zj");
  ASSERT_TRUE(old_epoch.ok());
  client::CheckpointSpec spec = FullSpec("zj", 7, 1);
  spec.epoch = *old_epoch;
  ASSERT_TRUE(client_->BeginCheckpoint(spec).ok());
  auto fresh = Connect();
  auto new_epoch = fresh->AcquireEpoch("zj");
  ASSERT_TRUE(new_epoch.ok());
  TestShard zombie = MakeShard("zj", 7, 0, {1 << 20}, 5);
  zombie.spec.epoch = *old_epoch;
  absl::Status s = client_->SaveShard(zombie.spec, zombie.Refs());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("superseded"), absl::string_view::npos) << s;
  EXPECT_TRUE(fresh->List("zj")->empty());
  // The new attempt writes the same step; its copies replace nothing of the zombie's.
  spec.epoch = *new_epoch;
  ASSERT_TRUE(fresh->BeginCheckpoint(spec).ok());
  TestShard good = MakeShard("zj", 7, 0, {1 << 20}, 6);
  good.spec.epoch = *new_epoch;
  absl::Status saved = fresh->SaveShard(good.spec, good.Refs());
  ASSERT_TRUE(saved.ok()) << saved;
  auto back = RestoreToString(fresh.get(), "zj", 7, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == good.Payload());
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
