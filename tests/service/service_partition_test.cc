// A storage node partitioned from etcd and back (docs/protocol.md, "Cluster mode",
// "Membership"): a real gradsnap-server in a network namespace of its own, joined to the host
// by two veth pairs the test makes and removes: one its clients reach it on, one it reaches
// etcd on. Taking the etcd link down cuts the node off from etcd while its clients still reach
// it, the partition in which a node could take writes the cluster has given up on.
//
// Needs root (network namespaces); skips with the reason where they cannot be made.
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/placement.h"
#include "gtest/gtest.h"
#include "service_test_util.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/netns.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

std::string NodeIdIn(const std::string& data_dir) {
  return std::string(absl::StripSuffix(*ReadFile(data_dir + "/node_id"), "\n"));
}

// Three nodes on loopback and node P in its namespace; a 1-member etcd listening on loopback
// and on the host end of P's etcd link. A checkpoint with a copy on P; then P's etcd link goes
// down: P refuses writes (UNAVAILABLE) from its clients, which still reach it, and keeps
// refusing them after etcd dropped its record; meanwhile the checkpoint is deleted (P's copy
// stays, P being unreachable for the delete) and saved again with other bytes. The link back
// up: P takes writes again only once it registered anew (a new lease); the step is deleted and
// saved a third time with P among its replicas: every copy, P's included, serves the newest
// bytes, never the ones P kept from before the partition.
TEST(ClusterPartition, PartitionedNodeRefusesWritesAndServesNothingStale) {
  if (std::string why = NetnsUnavailable(); !why.empty()) {
    GTEST_SKIP() << "network namespaces unavailable: " << why;
  }
  TempDir dir("cluster-partition");
  const int net = PrivateNet();
  const std::string tag = absl::StrCat(::getpid() % 100000);
  auto ns = NetNamespace::Create("gspart" + tag);
  ASSERT_TRUE(ns.ok()) << ns.status();
  const std::string data_if = "gsd" + tag, etcd_if = "gse" + tag;
  ASSERT_TRUE((*ns)->AddLink(data_if, absl::StrCat("10.", net, ".1.1/30"),
                             absl::StrCat("10.", net, ".1.2/30")).ok());
  ASSERT_TRUE((*ns)->AddLink(etcd_if, absl::StrCat("10.", net, ".2.1/30"),
                             absl::StrCat("10.", net, ".2.2/30")).ok());

  EtcdCluster etcd(dir.Sub("etcd"));
  EtcdCluster::Place place;
  place.hosts = {"127.0.0.1", absl::StrCat("10.", net, ".2.1")};
  ASSERT_TRUE(etcd.Start(1, {place}).ok()) << etcd.Log(0);
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
    const std::string data = dir.File(absl::StrCat("node", i));
    auto address = StartClusterNode(servers.back().get(), data, etcd.Endpoints(0),
                                    {"--lease-ttl-s", "2"});
    ASSERT_TRUE(address.ok()) << address.status();
    ids.push_back(NodeIdIn(data));
  }
  const std::string p_address = absl::StrCat("10.", net, ".1.2:7070");
  ServerProcess p(GRADSNAP_SERVER_BIN);
  p.set_wrap((*ns)->Wrap({}));
  ASSERT_TRUE(p.StartOn(dir.File("nodeP"), p_address,
                        {"--etcd", etcd.Endpoints(1), "--advertise", p_address,
                         "--lease-ttl-s", "2"})
                  .ok())
      << p.Log();
  const std::string p_id = NodeIdIn(dir.File("nodeP"));
  ids.push_back(p_id);
  const std::string p_key = cluster::kNodesPrefix + p_id;

  // A job whose rank 0 has a copy on P (P among the first 3 of its order over the 4 nodes).
  std::string job;
  for (int j = 0; j < 20 && job.empty(); ++j) {
    const std::string name = absl::StrCat("pj", j);
    std::vector<uint64_t> hashes;
    for (const std::string& id : ids) hashes.push_back(cluster::NodeHash(id));
    const std::vector<size_t> order =
        cluster::RankNodes(hashes, cluster::ShardKeyHash(name, 0), ids.size());
    for (size_t k = 0; k < 3; ++k) {
      if (order[k] == 3) job = name;
    }
  }
  ASSERT_FALSE(job.empty());

  cluster::EtcdOptions eo;
  eo.endpoints = *cluster::ParseEtcdEndpoints(etcd.Endpoints(0));
  auto etcd_client = *cluster::EtcdClient::Create(eo);
  cluster::ClusterCatalog catalog(etcd_client.get());
  auto connected = ConnectCluster(etcd.Endpoints(0));
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<client::Client> c = *std::move(connected);
  auto epoch = c->AcquireEpoch(job);
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  ASSERT_TRUE(SaveOneRank(c.get(), job, 1, *epoch, 1).ok());
  auto record = catalog.Get(job, 1);
  ASSERT_TRUE(record.ok()) << record.status();
  const auto& first_nodes = record->ranks.at(0).nodes;
  ASSERT_NE(std::find(first_nodes.begin(), first_nodes.end(), p_id), first_nodes.end());
  auto old = etcd_client->Get(p_key);
  ASSERT_TRUE(old.ok()) << old.status();

  // P's own clients reach it directly (a one-rank job of its own).
  auto direct = ConnectTo(p_address, /*max_attempts=*/1);
  ASSERT_NE(direct, nullptr);
  int64_t probe_step = 100;
  auto probe = [&] { return direct->BeginCheckpoint(FullSpec("probe", ++probe_step, 1)); };
  ASSERT_TRUE(probe().ok());

  // The partition.
  ASSERT_TRUE((*ns)->SetLinkUp(etcd_if, false).ok());
  absl::Status refused;
  ASSERT_TRUE(WaitFor([&] { return !(refused = probe()).ok(); }, 60)) << p.Log();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("lease"), absl::string_view::npos) << refused;
  // etcd gives up on P (its lease expires, its record goes) while P still refuses.
  ASSERT_TRUE(WaitFor([&] { return absl::IsNotFound(etcd_client->Get(p_key).status()); }, 60));
  refused = probe();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;

  // Without P: the step deleted (P keeps its copy: it cannot be reached for the delete) and
  // saved again with other bytes on the three others.
  ASSERT_TRUE(WaitFor([&] { return c->Delete(job, 1, *epoch).ok(); }, 30));
  const auto second = SaveOneRank(c.get(), job, 1, *epoch, 2);
  ASSERT_TRUE(second.ok()) << second.status();
  record = catalog.Get(job, 1);
  ASSERT_TRUE(record.ok()) << record.status();
  for (const std::string& id : record->ranks.at(0).nodes) EXPECT_NE(id, p_id);

  // The link back: the first write P takes comes after it registered again, under a new lease.
  ASSERT_TRUE((*ns)->SetLinkUp(etcd_if, true).ok());
  absl::Status accepted;
  ASSERT_TRUE(WaitFor([&] { return (accepted = probe()).ok(); }, 60)) << accepted << p.Log();
  auto again = etcd_client->Get(p_key);
  ASSERT_TRUE(again.ok()) << "P took a write before it registered again: " << again.status();
  EXPECT_NE(again->lease, old->lease);

  auto back = RestoreToString(c.get(), job, 1, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == second->Payload()) << "the copy P kept from before was served";

  // A client that knows P live again (it reads the node records when it connects): the step
  // deleted and saved a third time lands on P too, over P's leftover copy of the first.
  auto fresh_or = ConnectCluster(etcd.Endpoints(0));
  ASSERT_TRUE(fresh_or.ok()) << fresh_or.status();
  std::unique_ptr<client::Client> fresh = *std::move(fresh_or);
  ASSERT_TRUE(fresh->Delete(job, 1, *epoch).ok());
  const auto third = SaveOneRank(fresh.get(), job, 1, *epoch, 3);
  ASSERT_TRUE(third.ok()) << third.status();
  record = catalog.Get(job, 1);
  ASSERT_TRUE(record.ok()) << record.status();
  const auto& nodes = record->ranks.at(0).nodes;
  EXPECT_NE(std::find(nodes.begin(), nodes.end(), p_id), nodes.end());
  auto via_cluster = RestoreToString(fresh.get(), job, 1, 0);
  ASSERT_TRUE(via_cluster.ok()) << via_cluster.status();
  EXPECT_TRUE(*via_cluster == third->Payload());
  // P's own copy (the node-local job "<job>.r0") holds the newest bytes.
  auto on_p = RestoreToString(direct.get(), job + ".r0", 1, 0);
  ASSERT_TRUE(on_p.ok()) << on_p.status();
  EXPECT_TRUE(*on_p == third->Payload()) << "P serves the bytes it kept from before the partition";
  EXPECT_EQ(c->List(job)->size(), 1u);

  p.Stop();  // out of the namespace before it is removed
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
