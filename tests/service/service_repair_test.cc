// Repair, gc and the operator views of cluster mode (docs/protocol.md, "Cluster mode",
// "Repair"), with a real etcd and 4 real gradsnap-server processes started by the test on
// loopback (--repair-after 2s, --lease-ttl-s 2): a node SIGKILLed and every shard back at R
// copies, digest-checked, restorable from the repaired copies alone; a damaged source copy not
// propagated; the repairer SIGKILLed mid-copy and another node finishing.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "client/cluster_repair.h"
#include "client/remote_client.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/placement.h"
#include "common/token.h"
#include "gtest/gtest.h"
#include "service_test_util.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

class ClusterRepair : public ::testing::Test {
 protected:
  static constexpr int kNodes = 4;

  // Starts etcd and the nodes, each with `extra` flags; R copies per shard.
  void StartAll(int replicas, const std::vector<std::string>& extra = {}) {
    replicas_ = replicas;
    ASSERT_TRUE(etcd_.Start(1).ok()) << etcd_.Log(0);
    cluster::EtcdOptions eo;
    eo.endpoints = *cluster::ParseEtcdEndpoints(etcd_.Endpoints());
    etcd_client_ = *cluster::EtcdClient::Create(eo);
    catalog_ = std::make_unique<cluster::ClusterCatalog>(etcd_client_.get());
    std::vector<std::string> flags = {"--lease-ttl-s", "2", "--repair-after", "2s",
                                      "--metrics-listen", "127.0.0.1:0", "--prefault-uploads",
                                      "0", "--prefault-read-ahead=false"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    for (int i = 0; i < kNodes; ++i) {
      data_.push_back(dir_.File(absl::StrCat("node", i)));
      servers_.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
      auto address = StartClusterNode(servers_.back().get(), data_.back(), etcd_.Endpoints(), flags);
      ASSERT_TRUE(address.ok()) << address.status();
      addresses_.push_back(*address);
      ids_.push_back(std::string(absl::StripSuffix(*ReadFile(data_.back() + "/node_id"), "\n")));
    }
    client::ClientOptions o = client_options_;
    o.etcd = etcd_.Endpoints();
    o.cluster_replicas = replicas;
    o.min_replicas = 2;
    o.max_attempts = 3;
    auto c = client::Client::ConnectRemote(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }

  int Index(const std::string& id) const {
    return static_cast<int>(std::find(ids_.begin(), ids_.end(), id) - ids_.begin());
  }

  // Saves (job, step) with one shard of `bytes` per rank; returns the shards.
  std::vector<TestShard> Save(const std::string& job, int64_t step, int32_t ranks, uint64_t bytes,
                              uint64_t seed) {
    auto epoch = client_->AcquireEpoch(job);
    EXPECT_TRUE(epoch.ok()) << epoch.status();
    client::CheckpointSpec spec = FullSpec(job, step, ranks);
    spec.epoch = *epoch;
    EXPECT_TRUE(client_->BeginCheckpoint(spec).ok());
    std::vector<TestShard> out;
    for (int32_t r = 0; r < ranks; ++r) {
      out.push_back(MakeShard(job, step, r, {bytes}, seed + r));
      out.back().spec.epoch = *epoch;
      absl::Status s = client_->SaveShard(out.back().spec, out.back().Refs());
      EXPECT_TRUE(s.ok()) << s;
    }
    return out;
  }

  cluster::RankReplicas Replicas(const std::string& job, int64_t step, int32_t rank) {
    auto c = catalog_->Get(job, step);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? c->ranks.at(rank) : cluster::RankReplicas{};
  }

  // True once rank `rank` of (job, step) has `want` replicas in its record, none of them on a
  // node in `dead`.
  bool Repaired(const std::string& job, int64_t step, int32_t rank, size_t want,
                const std::set<int>& dead) {
    const cluster::RankReplicas r = Replicas(job, step, rank);
    if (r.nodes.size() != want) return false;
    for (const std::string& id : r.nodes) {
      if (dead.count(Index(id))) return false;
    }
    return true;
  }

  // The copy of rank `rank` on node `i` alone, read through a client of that node.
  std::string CopyOn(int i, const std::string& job, int64_t step, int32_t rank) {
    auto node = ConnectTo(addresses_[i], /*max_attempts=*/2);
    auto back = RestoreToString(node.get(), cluster::LocalJob(job, rank), step, 0);
    EXPECT_TRUE(back.ok()) << "node " << i << ": " << back.status();
    return back.ok() ? *back : "";
  }

  double Metric(int i, const char* name) {
    auto body = HttpGet(servers_[i]->metrics_port());
    return body.ok() ? std::max(0.0, MetricValue(*body, name)) : -1;
  }

  // The sum of metric `name` over the nodes but `skip` (a node killed: its metrics are gone).
  double MetricSum(const char* name, int skip) {
    double sum = 0;
    for (int i = 0; i < kNodes; ++i) {
      if (i != skip) sum += Metric(i, name);
    }
    return sum;
  }

  // The node index of the repairer (-1: none within 30 s).
  int Leader() {
    std::string id;
    WaitFor(
        [&] {
          auto kv = etcd_client_->Get(client::kRepairLeaderKey);
          if (kv.ok()) id = kv->value;
          return kv.ok();
        },
        30);
    return id.empty() ? -1 : Index(id);
  }

  // A job name whose rank 0 has none of its first `replicas_` nodes at node `avoid` ("" when
  // none of 100 names does).
  std::string JobAwayFrom(int avoid, const std::string& prefix) {
    for (int n = 0; n < 100; ++n) {
      const std::string j = absl::StrCat(prefix, n);
      const std::vector<std::string> order = cluster::OrderNodeIds(ids_, j, 0);
      if (std::find(order.begin(), order.begin() + replicas_, ids_[avoid]) ==
          order.begin() + replicas_) {
        return j;
      }
    }
    return "";
  }

  // R = 2 and every node's repair paced to 8 MiB/s; one rank of 32 MiB saved for a job whose
  // holders are not the repairer; the first holder SIGKILLed; returns once the repairer has
  // started on that rank (its source read takes 4 s).
  struct PacedRepair {
    int leader = -1, victim = -1;
    std::string job;
    cluster::RankReplicas replicas;
    std::vector<TestShard> saved;
  };
  void StartPacedRepair(const std::string& prefix, uint64_t seed, PacedRepair* out) {
    StartAll(2, {"--repair-bandwidth-mib-s", "8"});
    out->leader = Leader();
    ASSERT_GE(out->leader, 0);
    out->job = JobAwayFrom(out->leader, prefix);
    ASSERT_FALSE(out->job.empty());
    out->saved = Save(out->job, 0, 1, 32u << 20, seed);
    out->replicas = Replicas(out->job, 0, 0);
    ASSERT_EQ(out->replicas.nodes.size(), 2u);
    for (const std::string& id : out->replicas.nodes) ASSERT_NE(Index(id), out->leader);
    out->victim = Index(out->replicas.nodes[0]);
    servers_[out->victim]->Kill();
    ServerProcess* repairer = servers_[out->leader].get();
    ASSERT_TRUE(WaitFor(
        [&] { return absl::StrContains(repairer->Log(), "repair: repairing job " + out->job); },
        60))
        << repairer->Log();
  }

  // Kills the nodes of `first` but `victim` (killed already) and waits for their records to go;
  // then every rank of (job, step) for each step of `saved` must restore exactly from the
  // copies left (those repair made).
  void KillTheOtherHoldersAndRestore(const cluster::RankReplicas& first, int victim,
                                     const std::string& job,
                                     const std::vector<std::vector<TestShard>>& saved) {
    for (const std::string& id : first.nodes) {
      const int i = Index(id);
      if (i == victim) continue;
      servers_[i]->Kill();
      ASSERT_TRUE(Gone(i));
    }
    for (size_t step = 0; step < saved.size(); ++step) {
      for (size_t rank = 0; rank < saved[step].size(); ++rank) {
        auto back = RestoreToString(client_.get(), job, static_cast<int64_t>(step),
                                    static_cast<int32_t>(rank));
        ASSERT_TRUE(back.ok()) << "step " << step << " rank " << rank << ": " << back.status();
        EXPECT_TRUE(*back == saved[step][rank].Payload()) << "step " << step << " rank " << rank;
      }
    }
  }

  // Waits until node `i`'s record is gone from etcd (its lease expired).
  bool Gone(int i) {
    return WaitFor([&] { return !etcd_client_->Get(cluster::kNodesPrefix + ids_[i]).ok(); }, 30);
  }

  TempDir dir_{"cluster-repair"};
  EtcdCluster etcd_{dir_.Sub("etcd")};
  std::unique_ptr<cluster::EtcdClient> etcd_client_;
  std::unique_ptr<cluster::ClusterCatalog> catalog_;
  std::vector<std::string> data_, ids_, addresses_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  client::ClientOptions client_options_;  // StartAll's client: these, with the cluster's
  std::unique_ptr<client::Client> client_;
  int replicas_ = 3;
};

// A node SIGKILLed: after --repair-after every shard that had a copy on it is back at 3 copies,
// on live nodes only; each new copy serves the record's bytes; with the other original holders
// killed too, every shard restores exactly from the repaired copies alone.
TEST_F(ClusterRepair, KilledNodeIsReReplicatedAndRepairedCopiesRestoreAlone) {
  StartAll(3);
  const std::vector<TestShard> s0 = Save("rj", 0, 2, 4u << 20, 1);
  const std::vector<TestShard> s1 = Save("rj", 1, 2, 4u << 20, 5);
  const std::vector<std::vector<TestShard>> saved = {s0, s1};
  const cluster::RankReplicas first = Replicas("rj", 0, 0);
  ASSERT_EQ(first.nodes.size(), 3u);
  const int victim = Index(first.nodes[0]);
  servers_[victim]->Kill();
  for (int64_t step = 0; step < 2; ++step) {
    for (int32_t rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(WaitFor([&] { return Repaired("rj", step, rank, 3, {victim}); }, 90))
          << "step " << step << " rank " << rank << "\n" << servers_[(victim + 1) % kNodes]->Log();
    }
  }
  // Every copy each record names serves the saved bytes (digest-checked by the repairer, read
  // back here node by node).
  std::set<int> repaired_on;
  for (int64_t step = 0; step < 2; ++step) {
    for (int32_t rank = 0; rank < 2; ++rank) {
      for (const std::string& id : Replicas("rj", step, rank).nodes) {
        EXPECT_TRUE(CopyOn(Index(id), "rj", step, rank) == saved[step][rank].Payload())
            << "step " << step << " rank " << rank << " node " << Index(id);
      }
    }
  }
  const double bytes = MetricSum("gradsnap_repair_bytes_total", victim);
  EXPECT_GE(MetricSum("gradsnap_repair_shards_total", victim), 1);
  EXPECT_GE(bytes, 4u << 20);
  // Node to node: the new copies were pulled by their targets (PullCopy), none carried by the
  // repairer.
  EXPECT_EQ(MetricSum("gradsnap_repair_pulled_bytes_total", victim), bytes);
  EXPECT_EQ(MetricSum("gradsnap_repair_relayed_bytes_total", victim), 0);
  // The node that held no copy of rank 0 of step 0 got the repaired one; the other two
  // original holders go too, and everything restores from what repair made.
  int fresh = -1;
  for (int i = 0; i < kNodes; ++i) {
    if (std::find(first.nodes.begin(), first.nodes.end(), ids_[i]) == first.nodes.end()) fresh = i;
  }
  ASSERT_GE(fresh, 0);
  KillTheOtherHoldersAndRestore(first, victim, "rj", saved);
}

// Nodes that cannot pull (servers from before PullCopy, --test-no-pull-copy): the repairer
// reads the copy itself and writes it to the target, as before; the shards are back at 3.
TEST_F(ClusterRepair, TargetsThatCannotPullGetTheCopyRelayed) {
  StartAll(3, {"--test-no-pull-copy"});
  const std::vector<TestShard> saved = Save("oj", 0, 1, 4u << 20, 31);
  const cluster::RankReplicas first = Replicas("oj", 0, 0);
  ASSERT_EQ(first.nodes.size(), 3u);
  const int victim = Index(first.nodes[0]);
  servers_[victim]->Kill();
  ASSERT_TRUE(WaitFor([&] { return Repaired("oj", 0, 0, 3, {victim}); }, 90))
      << servers_[(victim + 1) % kNodes]->Log();
  EXPECT_EQ(MetricSum("gradsnap_repair_pulled_bytes_total", victim), 0);
  EXPECT_EQ(MetricSum("gradsnap_repair_relayed_bytes_total", victim), 4u << 20);
  for (const std::string& id : Replicas("oj", 0, 0).nodes) {
    EXPECT_TRUE(CopyOn(Index(id), "oj", 0, 0) == saved[0].Payload()) << "node " << Index(id);
  }
}

// PullCopy asked directly of the one node that holds no copy: a source that is not a live node,
// or whose copy does not have the record's digest, is refused (UNAVAILABLE, DATA_LOSS naming
// the source) and nothing is left on the target; the record's digest from a live holder copies
// exactly; a caller without the job's token is refused like a writer.
TEST_F(ClusterRepair, PullCopyChecksItsSourceAndItsCaller) {
  constexpr char kSecret[] = "0123456789abcdef-pull-secret";
  std::ofstream(dir_.File("secret")) << kSecret << "\n";
  client_options_.token = *MintJobToken(kSecret, "pj");
  StartAll(3, {"--auth-secret-file", dir_.File("secret")});
  const std::vector<TestShard> saved = Save("pj", 0, 1, 1u << 20, 41);
  const cluster::RankReplicas r = Replicas("pj", 0, 0);
  ASSERT_EQ(r.nodes.size(), 3u);
  int target = -1;
  for (int i = 0; i < kNodes; ++i) {
    if (std::find(r.nodes.begin(), r.nodes.end(), ids_[i]) == r.nodes.end()) target = i;
  }
  ASSERT_GE(target, 0);
  const std::string local = cluster::LocalJob("pj", 0);
  auto connect = [&](const std::string& token) {
    client::ClientOptions o;
    o.endpoints = {addresses_[target]};
    o.token = token;
    o.max_attempts = 1;
    auto c = client::Client::ConnectRemote(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::unique_ptr<client::remote::RemoteClient>(
        static_cast<client::remote::RemoteClient*>(c->release()));
  };
  auto node = connect(*MintJobToken(kSecret, local));
  auto other = connect(*MintJobToken(kSecret, "someone-else"));
  absl::StatusOr<uint64_t> got =
      other->PullCopy(local, 0, r.nodes[0], r.digest, r.raw_bytes, 30000);
  EXPECT_TRUE(absl::IsPermissionDenied(got.status()) || absl::IsUnauthenticated(got.status()))
      << got.status();
  got = node->PullCopy(local, 0, "00000000deadbeef", r.digest, r.raw_bytes, 30000);
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "not live")) << got.status();
  const std::string wrong(r.digest.size(), '0');
  got = node->PullCopy(local, 0, r.nodes[0], wrong, r.raw_bytes, 30000);
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "source node " + r.nodes[0]))
      << got.status();
  EXPECT_FALSE(node->Show(local, 0).ok()) << "a refused copy was written";
  got = node->PullCopy(local, 0, r.nodes[1], r.digest, r.raw_bytes, 30000);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, r.raw_bytes);
  auto back = RestoreToString(node.get(), local, 0, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == saved[0].Payload());
  EXPECT_EQ(Metric(target, "gradsnap_repair_pulled_bytes_total"), r.raw_bytes);
  // Asked again, or asked of a holder: the copy it serves is the record's, nothing is written
  // (a holder never drops its copy to fetch it anew); and no node copies from itself.
  got = node->PullCopy(local, 0, r.nodes[1], r.digest, r.raw_bytes, 30000);
  EXPECT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Metric(target, "gradsnap_repair_pulled_bytes_total"), r.raw_bytes);
  got = node->PullCopy(local, 0, ids_[target], r.digest, r.raw_bytes, 30000);
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
}

// Repairs run --repair-parallel ranks at once: with every copy paced to 8 MiB/s (a 4 MiB rank
// takes half a second), the ranks a killed node held are repaired with copies under way
// together (the repairer's pass line says how many at most), each rank back at 3 copies that
// serve its bytes.
TEST_F(ClusterRepair, RanksAreRepairedInParallel) {
  StartAll(3, {"--repair-bandwidth-mib-s", "8", "--repair-parallel", "4"});
  const std::vector<TestShard> saved = Save("mj", 0, 6, 4u << 20, 51);
  const int victim = Index(Replicas("mj", 0, 0).nodes[0]);
  int held = 0;
  for (int32_t rank = 0; rank < 6; ++rank) {
    const cluster::RankReplicas r = Replicas("mj", 0, rank);
    held += std::find(r.nodes.begin(), r.nodes.end(), ids_[victim]) != r.nodes.end() ? 1 : 0;
  }
  ASSERT_GE(held, 2) << "the victim holds too few ranks to repair in parallel";
  servers_[victim]->Kill();
  for (int32_t rank = 0; rank < 6; ++rank) {
    ASSERT_TRUE(WaitFor([&] { return Repaired("mj", 0, rank, 3, {victim}); }, 120))
        << "rank " << rank;
  }
  const int leader = Leader();
  ASSERT_GE(leader, 0);
  int most = 0;
  for (absl::string_view line : absl::StrSplit(servers_[leader]->Log(), '\n')) {
    const size_t at = line.find("copies at once");
    const size_t from = line.find("at most ");
    if (at == std::string::npos || from == std::string::npos) continue;
    int n = 0;
    if (absl::SimpleAtoi(line.substr(from + 8, at - from - 9), &n)) most = std::max(most, n);
  }
  EXPECT_GE(most, 2) << servers_[leader]->Log();
  // Ranks of one checkpoint repaired together each set their replicas (one record): none
  // failed for the other's update.
  EXPECT_EQ(MetricSum("gradsnap_repair_failures_total", victim), 0) << servers_[leader]->Log();
  for (int32_t rank = 0; rank < 6; ++rank) {
    for (const std::string& id : Replicas("mj", 0, rank).nodes) {
      EXPECT_TRUE(CopyOn(Index(id), "mj", 0, rank) == saved[rank].Payload())
          << "rank " << rank << " node " << Index(id);
    }
  }
}

// Secured nodes: mutual TLS (--tls-cert, --tls-key, --tls-client-ca) and a token secret
// (--auth-secret-file), each node with --peer-tls-ca. The client saves with its job's one token
// (granting the nodes' local jobs). The repairer reaches its peers with the cluster's CA, its own
// certificate and the token of the job it copies: a killed node's copies are restored to 3, and
// with the other original holders killed too every shard restores exactly from the repaired
// copies alone.
TEST_F(ClusterRepair, SecuredNodesRepairOverMutualTlsWithTheClusterSecret) {
  constexpr char kSecret[] = "0123456789abcdef-cluster-secret";
  ASSERT_TRUE(MakeTlsMaterial(dir_.path()).ok());
  std::ofstream(dir_.File("secret")) << kSecret << "\n";
  client_options_.tls.ca_file = dir_.File("ca.pem");
  client_options_.tls.cert_file = dir_.File("client.pem");
  client_options_.tls.key_file = dir_.File("client.key");
  client_options_.token = *MintJobToken(kSecret, "sj");
  StartAll(3, {"--tls-cert", dir_.File("server.pem"), "--tls-key", dir_.File("server.key"),
               "--tls-client-ca", dir_.File("ca.pem"), "--auth-secret-file",
               dir_.File("secret"), "--peer-tls-ca", dir_.File("ca.pem")});
  const std::vector<TestShard> saved = Save("sj", 0, 2, 4u << 20, 21);
  const cluster::RankReplicas first = Replicas("sj", 0, 0);
  ASSERT_EQ(first.nodes.size(), 3u);
  const int victim = Index(first.nodes[0]);
  servers_[victim]->Kill();
  for (int32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(WaitFor([&] { return Repaired("sj", 0, rank, 3, {victim}); }, 90))
        << "rank " << rank << "\n" << servers_[(victim + 1) % kNodes]->Log();
  }
  EXPECT_EQ(MetricSum("gradsnap_repair_failures_total", victim), 0) << [&] {
    std::string all;
    for (int i = 0; i < kNodes; ++i) {
      if (i != victim) absl::StrAppend(&all, "node ", i, ":\n", servers_[i]->Log());
    }
    return all;
  }();
  KillTheOtherHoldersAndRestore(first, victim, "sj", {saved});
}

// The first live holder's copy is damaged on disk and another holder is killed: the repairer
// reads the damaged copy, refuses it (counted as a failure), copies the good one; the new copy
// serves the saved bytes.
TEST_F(ClusterRepair, DamagedSourceCopyIsNotPropagated) {
  StartAll(3);
  const std::vector<TestShard> saved = Save("dj", 3, 1, 4u << 20, 9);
  const cluster::RankReplicas r = Replicas("dj", 3, 0);
  ASSERT_EQ(r.nodes.size(), 3u);
  const int damaged = Index(r.nodes[0]);
  const int victim = Index(r.nodes[1]);
  ASSERT_GT(FlipSegmentBytes(data_[damaged], cluster::LocalJob("dj", 0), 3, 0), 0);
  servers_[victim]->Kill();
  ASSERT_TRUE(WaitFor([&] { return Repaired("dj", 3, 0, 3, {victim}); }, 90))
      << servers_[damaged]->Log();
  int fresh = -1;
  for (const std::string& id : Replicas("dj", 3, 0).nodes) {
    if (std::find(r.nodes.begin(), r.nodes.end(), id) == r.nodes.end()) fresh = Index(id);
  }
  ASSERT_GE(fresh, 0);
  EXPECT_TRUE(CopyOn(fresh, "dj", 3, 0) == saved[0].Payload());
  double failures = 0;
  bool refused = false;
  for (int i = 0; i < kNodes; ++i) {
    if (i == victim) continue;
    failures += Metric(i, "gradsnap_repair_failures_total");
    refused |= absl::StrContains(servers_[i]->Log(), "source " + ids_[damaged] + ": ");
  }
  // The damaged source, tried first (record order), was refused and counted.
  EXPECT_GE(failures, 1);
  EXPECT_TRUE(refused);
}

// R = 2 and a paced repairer (8 MiB/s, a 32 MiB shard): one holder is SIGKILLed, and the
// repairer is SIGKILLed as soon as it starts copying; another node takes the leadership over
// and finishes: the rank is on 2 live nodes again and restores exactly.
TEST_F(ClusterRepair, RepairerKilledMidCopyAnotherFinishes) {
  PacedRepair run;
  ASSERT_NO_FATAL_FAILURE(StartPacedRepair("mj", 11, &run));
  const int leader = run.leader, victim = run.victim;
  const std::string& job = run.job;
  const cluster::RankReplicas& r = run.replicas;
  const std::vector<TestShard>& saved = run.saved;
  servers_[leader]->Kill();
  EXPECT_EQ(Replicas(job, 0, 0).nodes, r.nodes);  // the killed repairer changed nothing
  ASSERT_TRUE(WaitFor([&] { return Repaired(job, 0, 0, 2, {victim, leader}); }, 120));
  const int successor = Leader();
  ASSERT_GE(successor, 0);
  EXPECT_NE(successor, leader);
  EXPECT_GE(Metric(successor, "gradsnap_repair_shards_total"), 1);
  for (const std::string& id : Replicas(job, 0, 0).nodes) {
    EXPECT_TRUE(CopyOn(Index(id), job, 0, 0) == saved[0].Payload()) << "node " << Index(id);
  }
  auto back = RestoreToString(client_.get(), job, 0, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == saved[0].Payload());
}

// A checkpoint deleted (rm) while the repairer copies one of its shards: the delete wins, the
// repairer's record update fails (counted), and the copy it made is dropped again: no node keeps
// any data of it.
TEST_F(ClusterRepair, DeleteDuringRepairWinsAndTheNewCopyIsDropped) {
  PacedRepair run;
  ASSERT_NO_FATAL_FAILURE(StartPacedRepair("xj", 60, &run));
  const int leader = run.leader, victim = run.victim;
  const std::string& job = run.job;
  // The target has started reading the source (paced: 4 s) when the checkpoint is deleted.
  const std::string pulling = "repair: pulling " + cluster::LocalJob(job, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int i = 0; i < kNodes; ++i) {
          if (i != victim && absl::StrContains(servers_[i]->Log(), pulling)) return true;
        }
        return false;
      },
      60));
  ASSERT_TRUE(client_->Delete(job, 0).ok());  // while the target reads its source
  ASSERT_TRUE(WaitFor(
      [&] { return absl::StrContains(servers_[leader]->Log(), "while its replicas were set"); },
      60))
      << servers_[leader]->Log();
  EXPECT_EQ(catalog_->Get(job, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_GE(Metric(leader, "gradsnap_repair_failures_total"), 1);
  EXPECT_EQ(Metric(leader, "gradsnap_repair_shards_total"), 0);
  for (int i = 0; i < kNodes; ++i) {
    if (i == victim) continue;
    EXPECT_TRUE(SegmentFiles(data_[i], cluster::LocalJob(job, 0), 0).empty()) << "node " << i;
  }
}

// The record update of a repair is one transaction that loses cleanly: to a delete that came
// first (the record is not put back), and to a lost leadership (the guard on the leader key).
TEST(ClusterRepairTxn, SetReplicasLosesToADeleteAndToALostLeadership) {
  TempDir dir("repair-txn");
  EtcdCluster etcd(dir.Sub("etcd"));
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  cluster::EtcdOptions eo;
  eo.endpoints = *cluster::ParseEtcdEndpoints(etcd.Endpoints());
  auto kv = cluster::EtcdClient::Create(eo);
  ASSERT_TRUE(kv.ok());
  cluster::ClusterCatalog catalog(kv->get());
  cluster::RankReplicas rank{.raw_bytes = 10, .digest = "d", .nodes = {"a", "b", "c"}};
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(catalog.Begin(FullSpec("tj", step, 1), /*replicas=*/3).ok());
    ASSERT_TRUE(catalog.StageRank("tj", step, 0, 0, rank).ok());
    ASSERT_TRUE(catalog.Commit("tj", step, 0).ok());
  }
  auto one = catalog.Get("tj", 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->replicas, 3);
  ASSERT_TRUE(catalog.Delete("tj", 1, 0).ok());
  EXPECT_EQ(catalog.SetReplicas(*one, 0, {"b", "c", "d"}, nullptr).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(catalog.Get("tj", 1).status().code(), absl::StatusCode::kNotFound);

  // A guard on a leader key whose creation is not the one given: nothing changes.
  ASSERT_TRUE((*kv)->Put(client::kRepairLeaderKey, "other").ok());
  auto leader = (*kv)->Get(client::kRepairLeaderKey);
  ASSERT_TRUE(leader.ok());
  etcdserverpb::Compare guard;
  guard.set_key(client::kRepairLeaderKey);
  guard.set_target(etcdserverpb::Compare::CREATE);
  guard.set_result(etcdserverpb::Compare::EQUAL);
  guard.set_create_revision(leader->create_revision + 1);
  auto two = catalog.Get("tj", 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(catalog.SetReplicas(*two, 0, {"b", "c", "d"}, &guard).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(catalog.Get("tj", 2)->ranks.at(0).nodes, rank.nodes);
  guard.set_create_revision(leader->create_revision);
  ASSERT_TRUE(catalog.SetReplicas(*two, 0, {"b", "c", "d"}, &guard).ok());
  EXPECT_EQ(catalog.Get("tj", 2)->ranks.at(0).nodes, (std::vector<std::string>{"b", "c", "d"}));
  // A stale read (the revision moved on) loses too.
  EXPECT_EQ(catalog.SetReplicas(*two, 0, {"a"}, nullptr).code(), absl::StatusCode::kAborted);
}

// gc in cluster mode keeps what `restore latest` falls back to: FULLs 0, 2, 3, 4 and a DELTA 1
// on FULL 0; every copy of FULL 4 is damaged. `gc --keep-last 2` (the CLI) keeps 4 (damaged:
// kept, not counted), 3 and 2, and deletes FULL 0 with its DELTA: records first, then the data
// on every replica node.
TEST_F(ClusterRepair, GcKeepsTheFallbackAndDropsDataOnEveryReplica) {
  StartAll(3);
  std::map<int64_t, std::vector<TestShard>> saved;
  for (int64_t step : {0, 2, 3, 4}) saved[step] = Save("gj", step, 1, 1u << 20, 20 + step);
  {
    auto epoch = client_->AcquireEpoch("gj");
    ASSERT_TRUE(epoch.ok());
    client::CheckpointSpec delta = FullSpec("gj", 1, 1);
    delta.kind = client::CheckpointKind::kDelta;
    delta.base_step = 0;
    delta.epoch = *epoch;
    ASSERT_TRUE(client_->BeginCheckpoint(delta).ok());
    TestShard d = MakeShard("gj", 1, 0, {1u << 20}, 30);
    d.spec.epoch = *epoch;
    ASSERT_TRUE(client_->SaveShard(d.spec, d.Refs()).ok());
  }
  ASSERT_EQ(client_->List("gj")->size(), 5u);
  for (const std::string& id : Replicas("gj", 4, 0).nodes) {
    ASSERT_GT(FlipSegmentBytes(data_[Index(id)], cluster::LocalJob("gj", 0), 4, 0), 0);
  }
  const std::vector<std::string> held0 = Replicas("gj", 0, 0).nodes;
  const std::vector<std::string> held1 = Replicas("gj", 1, 0).nodes;
  RunResult gc = RunProgram(
      GRADSNAP_CLI_BIN, {"--etcd", etcd_.Endpoints(), "gc", "gj", "--keep-last", "2"}, 120);
  ASSERT_EQ(gc.exit_code, 0) << gc.out << gc.err;
  auto after = client_->List("gj", /*include_pending=*/true);
  ASSERT_TRUE(after.ok()) << after.status();
  std::vector<int64_t> listed;
  for (const auto& info : *after) listed.push_back(info.step);
  EXPECT_EQ(listed, (std::vector<int64_t>{2, 3, 4}));
  for (const std::string& id : held0) {
    EXPECT_TRUE(SegmentFiles(data_[Index(id)], cluster::LocalJob("gj", 0), 0).empty()) << id;
  }
  for (const std::string& id : held1) {
    EXPECT_TRUE(SegmentFiles(data_[Index(id)], cluster::LocalJob("gj", 0), 1).empty()) << id;
  }
  for (int64_t step : {2, 3}) {
    auto back = RestoreToString(client_.get(), "gj", step, 0);
    ASSERT_TRUE(back.ok()) << step << ": " << back.status();
    EXPECT_TRUE(*back == saved[step][0].Payload()) << step;
  }
  // With fewer FULLs that verify than asked for, nothing is deleted.
  auto none = client_->Gc("gj", client::GcPolicy{3, 0});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->deleted_steps.empty());
  EXPECT_EQ(client_->List("gj")->size(), 3u);
}

// A node SIGKILLed and restarted with its old data after repair replaced its copy and after a
// checkpoint it held was deleted: its stale copies are named by no record, so never served,
// and after --orphan-grace they are moved to quarantine/ (not deleted); its copy of a PENDING
// checkpoint (one rank of two saved) stays.
TEST_F(ClusterRepair, ReturningNodesStaleCopiesAreNotServedAndGoToQuarantine) {
  StartAll(3, {"--orphan-grace", "2s"});
  const std::vector<TestShard> s0 = Save("qj", 0, 1, 1u << 20, 50);
  Save("qj", 2, 1, 1u << 20, 51);
  {
    client::CheckpointSpec pending = FullSpec("qj", 1, 2);
    ASSERT_TRUE(client_->BeginCheckpoint(pending).ok());
    TestShard half = MakeShard("qj", 1, 0, {1u << 20}, 52);
    ASSERT_TRUE(client_->SaveShard(half.spec, half.Refs()).ok());
  }
  const cluster::RankReplicas before = Replicas("qj", 0, 0);
  const int away = Index(before.nodes[0]);
  const std::string local = cluster::LocalJob("qj", 0);
  for (int64_t step : {0, 1, 2}) ASSERT_FALSE(SegmentFiles(data_[away], local, step).empty()) << step;
  servers_[away]->Kill();
  ASSERT_TRUE(WaitFor([&] { return Repaired("qj", 0, 0, 3, {away}); }, 90));
  ASSERT_TRUE(client_->Delete("qj", 2).ok());  // the node that is away keeps its copy
  ASSERT_TRUE(servers_[away]->Restart().ok()) << servers_[away]->Log();

  // Not served: the record names the other three; a restore reads the saved bytes.
  const std::vector<std::string> now = Replicas("qj", 0, 0).nodes;
  EXPECT_EQ(std::count(now.begin(), now.end(), ids_[away]), 0);
  auto back = RestoreToString(client_.get(), "qj", 0, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == s0[0].Payload());
  // Quarantined after the grace: moved, not deleted.
  ASSERT_TRUE(WaitFor(
      [&] {
        return SegmentFiles(data_[away], local, 0).empty() &&
               SegmentFiles(data_[away], local, 2).empty();
      },
      60))
      << servers_[away]->Log();
  EXPECT_GT(CountFiles(data_[away] + "/quarantine"), 0);
  EXPECT_FALSE(SegmentFiles(data_[away], local, 1).empty());  // PENDING in etcd: kept
  for (const std::string& id : now) {
    EXPECT_FALSE(SegmentFiles(data_[Index(id)], local, 0).empty()) << "named copy on " << id;
  }
}

// Bad repair flags: one line, exit 2, never ready.
TEST(ClusterRepairFlags, BadValuesExitTwoWithOneLine) {
  TempDir dir("repair-flags");
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--repair-after", "0s"},
           {"--repair-after", "soon"},
           {"--orphan-grace", "500ms"},
           {"--repair-bandwidth-mib-s", "-1"},
           {"--repair-parallel", "0"},
           {"--repair-parallel", "65"},
           // TLS between nodes: a node serving TLS needs its peers' CA; a certificate its key.
           {"--tls-cert", dir.File("c.pem"), "--tls-key", dir.File("c.key")},
           {"--peer-tls-ca", dir.File("ca.pem"), "--peer-tls-cert", dir.File("c.pem")},
           {"--peer-tls-cert", dir.File("c.pem"), "--peer-tls-key", dir.File("c.key")}}) {
    std::vector<std::string> args = {"--data-dir", dir.File("data"), "--listen", "127.0.0.1:0",
                                     "--etcd", "127.0.0.1:2379", "--advertise", "127.0.0.1:7070"};
    args.insert(args.end(), flags.begin(), flags.end());
    RunResult r = RunProgram(GRADSNAP_SERVER_BIN, args, /*timeout_s=*/60);
    EXPECT_EQ(r.exit_code, 2) << flags[0] << " " << flags[1] << ": " << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap-server: ")) << r.err;
    EXPECT_EQ(r.out, "");
  }
  // Good values pass the flag checks: the start goes on to etcd (none here: exit 1).
  auto port = FreePort();
  ASSERT_TRUE(port.ok());
  RunResult good = RunProgram(
      GRADSNAP_SERVER_BIN,
      {"--data-dir", dir.File("data"), "--listen", "127.0.0.1:0", "--etcd",
       absl::StrCat("127.0.0.1:", *port), "--advertise", "127.0.0.1:7070", "--repair-after",
       "90s", "--orphan-grace", "2h", "--repair-bandwidth-mib-s", "100", "--repair-parallel",
       "8"},
      /*timeout_s=*/60);
  EXPECT_EQ(good.exit_code, 1) << good.err;
  EXPECT_TRUE(absl::StartsWith(good.err, "gradsnap-server: etcd unreachable")) << good.err;
}

// The line of `text` that starts with `word` ("" when none).
std::string LineOf(const std::string& text, const std::string& word) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, word)) return std::string(line);
  }
  return "";
}

// `gradsnap health` lists every node (id, address, alive, capacity, free, shards held), the
// repairer and the repair backlog; `gradsnap show` each rank's replicas. A node killed (repair
// held off by --repair-after 1h) is listed as not alive while records name it, its copies as
// gone, and the backlog counts them.
TEST_F(ClusterRepair, HealthListsNodesAndShowListsReplicas) {
  StartAll(3, {"--repair-after", "1h"});
  Save("hj", 5, 2, 1u << 20, 40);
  const std::vector<std::string> cli = {"--etcd", etcd_.Endpoints()};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), cli.begin(), cli.end());
    RunResult r = RunProgram(GRADSNAP_CLI_BIN, args, 60);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return r.out;
  };
  std::string health = run({"health"});
  EXPECT_TRUE(absl::StartsWith(health, "ok: cluster on etcd ")) << health;
  for (int i = 0; i < kNodes; ++i) {
    const std::string line = LineOf(health, ids_[i]);
    EXPECT_TRUE(absl::StrContains(line, addresses_[i] + "  yes")) << health;
  }
  EXPECT_TRUE(absl::StrContains(health, "under-replicated shards: 0")) << health;
  const int leader = Leader();
  ASSERT_GE(leader, 0);
  EXPECT_TRUE(absl::StrContains(health, "repairer: " + ids_[leader])) << health;
  std::string json = run({"--json", "health"});
  EXPECT_TRUE(absl::StrContains(json, "\"id\":\"" + ids_[0] + "\",\"address\":\"" +
                                          addresses_[0] + "\",\"alive\":true,\"capacity_bytes\":"))
      << json;
  const cluster::RankReplicas r0 = Replicas("hj", 5, 0);
  std::string show = run({"show", "hj", "5"});
  std::string rank0;
  for (const std::string& id : r0.nodes) {
    rank0 += (rank0.empty() ? "" : ", ") + id + " (" + addresses_[Index(id)] + ")";
  }
  EXPECT_TRUE(absl::StrContains(show, "   0  " + rank0)) << show;
  EXPECT_TRUE(absl::StrContains(run({"--json", "show", "hj", "5"}), "\"replicas\":{\"0\":[")) << show;

  const int victim = Index(r0.nodes[1]);
  servers_[victim]->Kill();
  ASSERT_TRUE(Gone(victim));
  health = run({"health"});
  EXPECT_TRUE(absl::StartsWith(LineOf(health, ids_[victim]), ids_[victim] + "  -")) << health;
  EXPECT_TRUE(absl::StrContains(LineOf(health, ids_[victim]), "  no  ")) << health;
  EXPECT_FALSE(absl::StrContains(health, "under-replicated shards: 0")) << health;
  show = run({"show", "hj", "5"});
  EXPECT_TRUE(absl::StrContains(show, ids_[victim] + " (gone)")) << show;
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
