// The etcd client, node ids and membership against a real etcd (Debian's etcd-server) started
// by the test on loopback ports (tests/testing/etcd_cluster.h).
#include "cluster/etcd_client.h"

#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/membership.h"
#include "cluster/node_id.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace cluster {
namespace {

using testing::EtcdCluster;
using testing::TempDir;
using testing::WaitFor;

std::unique_ptr<EtcdClient> Connect(const std::string& endpoints, int timeout_ms = 3000,
                                    int call_timeout_ms = 0) {
  auto parsed = ParseEtcdEndpoints(endpoints);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  EtcdOptions o;
  o.endpoints = *parsed;
  o.rpc_timeout_ms = timeout_ms;
  o.call_timeout_ms = call_timeout_ms;
  auto c = EtcdClient::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

TEST(EtcdEndpoints, ParsesAndRejects) {
  bool tls = true;
  auto ok = ParseEtcdEndpoints("http://127.0.0.1:2379,etcd-b:2379/,[::1]:23790", &tls);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (std::vector<std::string>{"127.0.0.1:2379", "etcd-b:2379", "[::1]:23790"}));
  EXPECT_FALSE(tls);
  auto secure = ParseEtcdEndpoints("https://127.0.0.1:2379,https://etcd-b:2379/", &tls);
  ASSERT_TRUE(secure.ok()) << secure.status();
  EXPECT_EQ(*secure, (std::vector<std::string>{"127.0.0.1:2379", "etcd-b:2379"}));
  EXPECT_TRUE(tls);
  for (const char* bad : {"", "localhost", "h:0", "h:70000", "h:x", ":2379", "a:1,,b:2",
                          "https://h:2379,h:2380", "https://h:1,https://h:1", "h:1,h:1",
                          "http://h:1/v3"}) {
    auto r = ParseEtcdEndpoints(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(std::string(r.status().message()).find('\n'), std::string::npos) << bad;
  }
}

TEST(EtcdClient, KvAndTxnOnARealEtcd) {
  TempDir dir("etcd-kv");
  EtcdCluster etcd(dir.path());
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  auto c = Connect(etcd.Endpoints());

  EXPECT_EQ(c->Get("/t/a").status().code(), absl::StatusCode::kNotFound);
  auto rev = c->Put("/t/b", "2");
  ASSERT_TRUE(rev.ok()) << rev.status();
  ASSERT_TRUE(c->Put("/t/a", std::string("1\0x", 3)).ok());
  ASSERT_TRUE(c->Put("/u", "outside").ok());
  auto a = c->Get("/t/a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->value, std::string("1\0x", 3));  // bytes, not strings
  EXPECT_EQ(a->version, 1);
  int64_t at = 0;
  auto all = c->GetPrefix("/t/", &at);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].key, "/t/a");  // sorted by key
  EXPECT_EQ((*all)[1].key, "/t/b");
  EXPECT_GT(at, *rev);

  // Create-if-absent: the second identical transaction fails its compare.
  etcdserverpb::TxnRequest txn;
  auto* cmp = txn.add_compare();
  cmp->set_key("/t/c");
  cmp->set_target(etcdserverpb::Compare::VERSION);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_version(0);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key("/t/c");
  put->set_value("first");
  txn.add_failure()->mutable_request_range()->set_key("/t/c");
  auto first = c->Txn(txn);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->succeeded());
  put->set_value("second");
  auto second = c->Txn(txn);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->succeeded());
  ASSERT_EQ(second->responses_size(), 1);
  EXPECT_EQ(second->responses(0).response_range().kvs(0).value(), "first");

  auto deleted = c->DeletePrefix("/t/");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 3);
  EXPECT_EQ(c->GetPrefix("/t/")->size(), 0u);
  EXPECT_EQ(c->Get("/u")->value, "outside");
  EXPECT_EQ(*c->Delete("/u"), 1);
}

TEST(EtcdClient, LeaseGrantKeepAliveRevoke) {
  TempDir dir("etcd-lease");
  EtcdCluster etcd(dir.path());
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  auto c = Connect(etcd.Endpoints());
  auto lease = c->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->id, 0);
  EXPECT_GE(lease->ttl_s, 30);
  ASSERT_TRUE(c->Put("/l/k", "v", lease->id).ok());
  EXPECT_EQ(c->Get("/l/k")->lease, lease->id);
  auto ttl = c->KeepAliveOnce(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GT(*ttl, 0);
  ASSERT_TRUE(c->RevokeLease(lease->id).ok());
  EXPECT_EQ(c->Get("/l/k").status().code(), absl::StatusCode::kNotFound);  // went with it
  auto gone = c->KeepAliveOnce(lease->id);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_LE(*gone, 0);
  // A key put under a lease that no longer exists is refused.
  EXPECT_FALSE(c->Put("/l/k", "v", lease->id).ok());
}

TEST(EtcdClient, UnreachableEtcdIsUnavailable) {
  auto port = testing::FreePort();
  ASSERT_TRUE(port.ok());
  auto c = Connect(absl::StrCat("127.0.0.1:", *port), 1000);
  absl::Status s = c->Put("/k", "v").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(std::string(s.message()).find("etcd unreachable"), std::string::npos) << s;
}

// A 3-member etcd: one member killed changes nothing for calls or watches.
TEST(EtcdClient, MemberKilledCallsAndWatchGoOn) {
  TempDir dir("etcd-3");
  EtcdCluster etcd(dir.path());
  ASSERT_TRUE(etcd.Start(3).ok()) << etcd.Log(0);
  auto c = Connect(etcd.Endpoints());
  absl::Mutex mu;
  std::vector<std::string> seen;  // "+key=value" / "-key"
  auto watch = c->WatchPrefix("/w/", 0, [&](const std::vector<EtcdEvent>& events, int64_t,
                                            bool compacted) {
    absl::MutexLock lock(&mu);
    if (compacted) seen.push_back("compacted");
    for (const EtcdEvent& e : events) {
      seen.push_back(e.deleted ? "-" + e.kv.key : "+" + e.kv.key + "=" + e.kv.value);
    }
  });
  ASSERT_TRUE(watch->WaitCreated(30000));
  ASSERT_TRUE(c->Put("/w/a", "1").ok());
  ASSERT_TRUE(c->Put("/x", "not watched").ok());
  ASSERT_TRUE(c->Delete("/w/a").ok());
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return seen.size();
  };
  ASSERT_TRUE(WaitFor([&] { return count() >= 2; }, 30));
  // The member the client and the watch talk to (the first) goes; the rest keep a quorum.
  etcd.Kill(0);
  ASSERT_TRUE(c->Put("/w/b", "2").ok());
  auto b = c->Get("/w/b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->value, "2");
  ASSERT_TRUE(WaitFor([&] { return count() >= 3; }, 30));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"+/w/a=1", "-/w/a", "+/w/b=2"}));
}

// With call_timeout_ms a call goes on trying the members, pass after pass, until its end: a
// write made while etcd has no quorum goes through once the quorum is back within that time,
// where a single pass fails UNAVAILABLE. (Restart waits until the member is healthy.)
TEST(EtcdClient, CallTimeoutOutlastsAShortQuorumLoss) {
  TempDir dir("etcd-passes");
  EtcdCluster etcd(dir.path());
  ASSERT_TRUE(etcd.Start(3).ok()) << etcd.Log(0);
  auto one_pass = Connect(etcd.Endpoints(), 300);
  auto passes = Connect(etcd.Endpoints(), 300, /*call_timeout_ms=*/60000);
  ASSERT_TRUE(passes->Put("/passes/k", "before").ok());
  etcd.Kill(1);
  etcd.Kill(2);
  absl::StatusOr<int64_t> single = one_pass->Put("/passes/k", "single");
  EXPECT_EQ(single.status().code(), absl::StatusCode::kUnavailable) << single.status();
  absl::StatusOr<int64_t> during = absl::UnknownError("not run");
  std::thread writer([&] { during = passes->Put("/passes/k", "during"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // several passes fail meanwhile
  ASSERT_TRUE(etcd.Restart(1).ok()) << etcd.Log(1);
  writer.join();
  EXPECT_TRUE(during.ok()) << during.status();
  auto kv = passes->Get("/passes/k");
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->value, "during");
}

TEST(NodeId, MadeOnceAndKept) {
  TempDir dir("node-id");
  auto first = LoadOrCreateNodeId(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(IsValidNodeId(*first));
  EXPECT_EQ(*LoadOrCreateNodeId(dir.path()), *first);
  TempDir other("node-id");
  EXPECT_NE(*LoadOrCreateNodeId(other.path()), *first);
  ASSERT_EQ(std::system(("echo garbage > " + dir.File(kNodeIdFile)).c_str()), 0);
  EXPECT_EQ(LoadOrCreateNodeId(dir.path()).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(*testing::ReadFile(dir.File(kNodeIdFile)), "garbage\n");  // never overwritten
}

// A node registers under its lease; with etcd gone it refuses writes once the lease could have
// run out, and takes them again once etcd is back and the lease renewed or granted anew.
TEST(Membership, RegistersAndRefusesWritesWithoutItsLease) {
  TempDir dir("membership");
  EtcdCluster etcd(dir.path());
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  auto c = Connect(etcd.Endpoints(), 1000);
  MembershipOptions o;
  o.node_id = "00112233aabbccdd";
  o.address = "127.0.0.1:7070";
  o.ttl_s = 3;
  o.space = [](uint64_t* cap, uint64_t* free) {
    *cap = 1000;
    *free = 600;
  };
  auto m = Membership::Join(c.get(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->WritesAllowed().ok());
  auto kv = c->Get(std::string(kNodesPrefix) + o.node_id);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto rec = DecodeNodeRecord(*kv);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->id, o.node_id);
  EXPECT_EQ(rec->address, o.address);
  EXPECT_EQ(rec->capacity_bytes, 1000u);
  EXPECT_EQ(rec->free_bytes, 600u);
  EXPECT_EQ(rec->lease, (*m)->lease_id());

  etcd.Kill(0);
  ASSERT_TRUE(WaitFor([&] { return !(*m)->WritesAllowed().ok(); }, 60));
  absl::Status refused = (*m)->WritesAllowed();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  // Writes are refused the moment the lease's time runs out; the keep-alive thread counts
  // the loss at its next turn (after a keep-alive call to the dead member returns).
  EXPECT_TRUE(WaitFor([&] { return (*m)->lease_losses() >= 1; }, 30));
  EXPECT_EQ((*m)->lease_losses(), 1u);
  ASSERT_TRUE(etcd.Restart(0).ok()) << etcd.Log(0);
  ASSERT_TRUE(WaitFor([&] { return (*m)->WritesAllowed().ok(); }, 60));
  // Registered again (the old lease renewed, or a new one granted with the record put anew).
  ASSERT_TRUE(WaitFor([&] { return c->Get(std::string(kNodesPrefix) + o.node_id).ok(); }, 30));
  EXPECT_EQ(c->Get(std::string(kNodesPrefix) + o.node_id)->lease, (*m)->lease_id());

  m->reset();  // leaves: its lease is revoked, its record gone at once
  EXPECT_EQ(c->Get(std::string(kNodesPrefix) + o.node_id).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace cluster
}  // namespace gradsnap
