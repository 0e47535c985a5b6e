// End to end against real gradsnap-server processes on 127.0.0.1: save several shards of
// several ranks through the remote client, list, show, verify, restore byte-identical, the RAM
// tier and the metrics endpoint; two nodes with replicas and placement.
#include <future>
#include <filesystem>
#include <string>
#include <vector>

#include "client/backends.h"
#include "client/client.h"
#include "common/digest.h"
#include "gtest/gtest.h"
#include "storage/epoch.h"
#include "storage/file_system.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/gtest_util.h"

namespace gradsnap {
namespace testing {
namespace {

using client::Client;
using client::ClientOptions;

std::unique_ptr<Client> Connect(const std::vector<std::string>& endpoints, int replicas = 1) {
  ClientOptions o;
  o.endpoints = endpoints;
  o.replicas = replicas;
  return ValueOrNull(client::NewRemoteClient(o));
}

TEST(ServiceE2E, SaveListShowVerifyRestore) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  auto c = ValueOrNull(StartAndConnect(&server, dir.File("data"),
                                       {"--cache-bytes", "0", "--metrics-listen", "127.0.0.1:0"}));
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Health().ok());
  constexpr int kRanks = 3;
  std::vector<TestShard> shards;
  for (int r = 0; r < kRanks; ++r) {
    shards.push_back(MakeShard("e2e-job", 10, r, {3 << 20, 12345 * 4, 0, 1 << 20}, 7));
  }
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("e2e-job", 10, kRanks)).ok());
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("e2e-job", 10, kRanks)).ok());  // idempotent
  std::vector<std::future<absl::Status>> saves;
  for (int r = 0; r < kRanks - 1; ++r) saves.push_back(c->SaveShardAsync(shards[r].spec, shards[r].Refs()));
  for (auto& f : saves) ASSERT_TRUE(f.get().ok());
  // Not all ranks: nothing listed yet.
  auto listed = c->List("e2e-job");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  ASSERT_TRUE(c->SaveShard(shards[kRanks - 1].spec, shards[kRanks - 1].Refs()).ok());
  // Saving a committed shard again is idempotent.
  ASSERT_TRUE(c->SaveShard(shards[0].spec, shards[0].Refs()).ok());

  listed = c->List("e2e-job");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].step, 10);
  EXPECT_EQ((*listed)[0].state, client::CheckpointState::kCommitted);
  auto jobs = c->ListJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(*jobs, std::vector<std::string>{"e2e-job"});

  auto m = c->Show("e2e-job", 10);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->shards.size(), static_cast<size_t>(kRanks));
  EXPECT_EQ(m->shards[1].tensors.size(), 4u);
  EXPECT_EQ(m->info.raw_bytes, kRanks * shards[0].Payload().size());
  EXPECT_TRUE(c->Verify("e2e-job", 10).ok());

  for (int r = 0; r < kRanks; ++r) {
    auto got = RestoreToString(c.get(), "e2e-job", 10, r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == shards[r].Payload()) << "rank " << r;
  }
  std::string one(shards[2].data[3].size(), '\0');
  ASSERT_TRUE(c->RestoreTensor("e2e-job", 10, 2, "layer3.weight", one.data(), one.size()).ok());
  EXPECT_TRUE(one == shards[2].data[3]);
  EXPECT_EQ(c->RestoreTensor("e2e-job", 10, 2, "nope", one.data(), one.size()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Show("e2e-job", 11).status().code(), absl::StatusCode::kNotFound);

  // Metrics endpoint: bytes in, commits, no cache hits (cache off).
  auto body = HttpGet(server.metrics_port());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_GE(MetricValue(*body, "gradsnap_bytes_in_total"), 3.0 * shards[0].Payload().size());
  EXPECT_EQ(MetricValue(*body, "gradsnap_cache_hits_total"), 0);
  EXPECT_EQ(MetricValue(*body, "gradsnap_checkpoint_commits_total"), 1);
  ASSERT_TRUE(c->Delete("e2e-job", 10).ok());
  listed = c->List("e2e-job");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  c.reset();  // an idle open connection delays a graceful shutdown by seconds
  EXPECT_EQ(server.Stop(), 0);
}

// A restarted attempt re-persisting a committed step through the server: begin and
// the same bytes are idempotent; other bytes are an ALREADY_EXISTS conflict and change nothing;
// an older writer epoch is refused as superseded once a newer one was acquired.
TEST(ServiceE2E, RePersistIdempotentConflictAndEpochs) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir.File("data")).ok());
  auto c = Connect({server.address()});
  ASSERT_NE(c, nullptr);
  auto e1 = c->AcquireEpoch("re");
  ASSERT_TRUE(e1.ok()) << e1.status();
  client::CheckpointSpec spec = FullSpec("re", 4, 1);
  spec.epoch = *e1;
  TestShard shard = MakeShard("re", 4, 0, {1 << 20, 4096}, 3);
  shard.spec.epoch = *e1;
  ASSERT_TRUE(c->BeginCheckpoint(spec).ok());
  ASSERT_TRUE(c->SaveShard(shard.spec, shard.Refs()).ok());

  auto e2 = c->AcquireEpoch("re");
  ASSERT_TRUE(e2.ok());
  EXPECT_GT(*e2, *e1);
  spec.epoch = shard.spec.epoch = *e2;
  EXPECT_TRUE(c->BeginCheckpoint(spec).ok());  // committed, same spec
  EXPECT_TRUE(c->SaveShard(shard.spec, shard.Refs()).ok());
  TestShard other = MakeShard("re", 4, 0, {1 << 20, 4096}, 4);
  other.spec.epoch = *e2;
  absl::Status conflict = c->SaveShard(other.spec, other.Refs());
  EXPECT_EQ(conflict.code(), absl::StatusCode::kAlreadyExists) << conflict;
  auto back = RestoreToString(c.get(), "re", 4, 0);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == shard.Payload());

  // The older attempt can no longer begin or write anything.
  client::CheckpointSpec old_spec = FullSpec("re", 8, 1);
  old_spec.epoch = *e1;
  absl::Status refused = c->BeginCheckpoint(old_spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find(absl::StrCat("superseded by attempt ", *e2)),
            absl::string_view::npos);
  client::CheckpointSpec new_spec = FullSpec("re", 8, 1);
  new_spec.epoch = *e2;
  ASSERT_TRUE(c->BeginCheckpoint(new_spec).ok());
  TestShard late = MakeShard("re", 8, 0, {4096}, 5);
  late.spec.epoch = *e1;
  EXPECT_EQ(c->SaveShard(late.spec, late.Refs()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->List("re")->size(), 1u);
}

// Two nodes whose epoch counters drifted apart (node a holds an epoch node b never saw):
// the attempt takes the largest answer and node b is raised to it, so b refuses an older
// attempt just as a does.
TEST(ServiceE2E, DriftedNodesFenceTheSameOlderAttempts) {
  TempDir dir;
  ServerProcess a(GRADSNAP_SERVER_BIN), b(GRADSNAP_SERVER_BIN);
  // Node a's counter far ahead of b's (and of the clock both take epochs at least from): its
  // data dir starts with the epoch mirror of an attempt b never saw.
  std::filesystem::create_directories(dir.File("a"));
  ASSERT_TRUE(storage::MirrorJobEpoch(storage::FileSystem::Default(), dir.File("a"), "drift",
                                      uint64_t{1} << 50)
                  .ok());
  ASSERT_TRUE(a.StartOn(dir.File("a")).ok());
  ASSERT_TRUE(b.StartOn(dir.File("b")).ok());
  auto both = Connect({a.address(), b.address()});
  auto epoch = both->AcquireEpoch("drift");
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(*epoch, (uint64_t{1} << 50) + 1);
  auto only_b = Connect({b.address()});
  client::CheckpointSpec zombie = FullSpec("drift", 3, 1);
  zombie.epoch = uint64_t{1} << 50;  // an older attempt's
  absl::Status refused = only_b->BeginCheckpoint(zombie);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find(absl::StrCat("superseded by attempt ", *epoch)),
            absl::string_view::npos)
      << refused;
  client::CheckpointSpec current = FullSpec("drift", 3, 1);
  current.epoch = *epoch;
  EXPECT_TRUE(both->BeginCheckpoint(current).ok());
  // The next attempt counts on from the newest on every node.
  EXPECT_EQ(*both->AcquireEpoch("drift"), *epoch + 1);
}

// A shard whose info nearly fills a 4 MiB message (14,000 tensors with 125-character names and
// SHA-256 digests: 3.9 MB) saves and restores: a first message carries only the data that fits
// beside the spec or the info. One whose info could not be sent in a message (18,000 tensors)
// is refused at its first upload message with a clear error; nothing is stored.
TEST(ServiceE2E, ShardInfoNearTheMessageLimit) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir.File("data"), "127.0.0.1:0", {"--digest", "sha256"}).ok());
  auto c = Connect({server.address()});
  auto shard_of = [](int tensors, int64_t step) {
    TestShard shard = MakeShard("bigspec", step, 0, std::vector<uint64_t>(tensors, 64), 3);
    for (int i = 0; i < tensors; ++i) {
      shard.spec.tensors[i].name = absl::StrCat(std::string(120, 'n'), ".", i);
    }
    return shard;
  };
  TestShard fits = shard_of(14000, 1);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("bigspec", 1, 1)).ok());
  absl::Status saved = c->SaveShard(fits.spec, fits.Refs());
  ASSERT_TRUE(saved.ok()) << saved;
  auto back = RestoreToString(c.get(), "bigspec", 1, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == fits.Payload());

  TestShard too_big = shard_of(18000, 2);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("bigspec", 2, 1)).ok());
  absl::Status refused = c->SaveShard(too_big.spec, too_big.Refs());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("more than one message holds"), absl::string_view::npos)
      << refused;
  auto m = c->Show("bigspec", 2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->shards.empty() || m->shards[0].raw_bytes == 0 || !m->shards[0].committed);
}

// A server with a 64 MB RAM tier and a metrics port.
const std::vector<std::string> kCachedServer = {"--cache-bytes", "64000000", "--metrics-listen",
                                                "127.0.0.1:0"};

TEST(ServiceE2E, RamTierServesRestoreAndCountsHits) {
  TestNode node(kCachedServer);
  ASSERT_TRUE(node.status.ok()) << node.status;
  client::Client* c = node.client.get();
  std::vector<TestShard> shards;
  for (int step : {1, 2}) {
    ASSERT_TRUE(c->BeginCheckpoint(FullSpec("cached", step, 2)).ok());
    for (int r = 0; r < 2; ++r) {
      TestShard s = MakeShard("cached", step, r, {4 << 20, 1000}, step);
      ASSERT_TRUE(c->SaveShard(s.spec, s.Refs()).ok());
      if (step == 2) shards.push_back(std::move(s));
    }
  }
  for (int r = 0; r < 2; ++r) {
    auto got = RestoreToString(c, "cached", 2, r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == shards[r].Payload());
  }
  // The older step is no longer cached but still restorable from disk.
  auto old = RestoreToString(c, "cached", 1, 0);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(*old == MakeShard("cached", 1, 0, {4 << 20, 1000}, 1).Payload());
  std::string tensor(1000, '\0');
  ASSERT_TRUE(c->RestoreTensor("cached", 2, 1, "layer1.weight", tensor.data(), 1000).ok());
  EXPECT_TRUE(tensor == shards[1].data[1]);

  auto body = HttpGet(node.server.metrics_port());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(MetricValue(*body, "gradsnap_cache_hits_total"), 3);
  EXPECT_EQ(MetricValue(*body, "gradsnap_cache_misses_total"), 1);
  EXPECT_EQ(MetricValue(*body, "gradsnap_checkpoint_commits_total"), 2);
  EXPECT_GE(MetricValue(*body, "gradsnap_bytes_in_total"), 4 * (4 << 20));
  EXPECT_GT(MetricValue(*body, "gradsnap_write_seconds_count"), 0);
  EXPECT_EQ(MetricValue(*body, "gradsnap_inflight_bytes"), 0);
}

// GoCkpt with --grad-log commits a DELTA every step: the RAM tier keeps the recovery point's
// base FULL and every DELTA of its chain, so restoring `latest` (the FULL, then each DELTA)
// never reads the disk. A new FULL supersedes the chain.
TEST(ServiceE2E, RamTierKeepsTheDeltaChainOfTheRecoveryPoint) {
  TestNode node(kCachedServer);
  ASSERT_TRUE(node.status.ok()) << node.status;
  client::Client* c = node.client.get();
  auto save = [&](int64_t step, int64_t base) {
    client::CheckpointSpec spec = FullSpec("chain", step, 1);
    if (base >= 0) {
      spec.kind = client::CheckpointKind::kDelta;
      spec.base_step = base;
    }
    ASSERT_TRUE(c->BeginCheckpoint(spec).ok());
    TestShard s = MakeShard("chain", step, 0, {base >= 0 ? 100000u : 1000000u}, step);
    ASSERT_TRUE(c->SaveShard(s.spec, s.Refs()).ok());
  };
  auto counts = [&] {
    auto body = HttpGet(node.server.metrics_port());
    EXPECT_TRUE(body.ok()) << body.status();
    return std::make_pair(MetricValue(*body, "gradsnap_cache_hits_total"),
                          MetricValue(*body, "gradsnap_cache_misses_total"));
  };
  save(10, -1);
  for (int64_t step = 11; step <= 13; ++step) save(step, 10);
  for (int64_t step = 10; step <= 13; ++step) {
    auto got = RestoreToString(c, "chain", step, 0);
    ASSERT_TRUE(got.ok()) << got.status();
  }
  EXPECT_EQ(counts(), std::make_pair(4.0, 0.0)) << "the chain was read from disk";
  save(14, -1);  // a new FULL: the old chain is superseded
  for (int64_t step : {10, 13, 14}) ASSERT_TRUE(RestoreToString(c, "chain", step, 0).ok());
  EXPECT_EQ(counts(), std::make_pair(5.0, 2.0));
}

// --digest picks the algorithm of new shards; a restarted server with another choice keeps
// serving and verifying the old ones with the algorithm that wrote them.
TEST(ServiceE2E, DigestFlagAndMixedDigestStore) {
  TempDir dir;
  std::vector<TestShard> shards = {MakeShard("dg", 1, 0, {1 << 20, 4096}, 5),
                                   MakeShard("dg", 2, 0, {1 << 20, 4096}, 6)};
  for (int i = 0; i < 2; ++i) {
    ServerProcess server(GRADSNAP_SERVER_BIN);
    std::vector<std::string> args = {"--data-dir", dir.File("data"), "--listen", "127.0.0.1:0"};
    if (i == 0) args.insert(args.end(), {"--digest", "sha256"});
    ASSERT_TRUE(server.Start(args).ok()) << server.Log();
    auto c = Connect({server.address()});
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->BeginCheckpoint(FullSpec("dg", i + 1, 1)).ok());
    ASSERT_TRUE(c->SaveShard(shards[i].spec, shards[i].Refs()).ok());
    for (int step = 1; step <= i + 1; ++step) {
      SCOPED_TRACE(step);
      auto m = c->Show("dg", step);
      ASSERT_TRUE(m.ok()) << m.status();
      const client::ShardInfo& s = m->shards.at(0);
      DigestAlgo want = step == 1 ? DigestAlgo::kSha256 : DigestAlgo::kXxh3_128;
      EXPECT_EQ(s.digest_algo, want);
      for (size_t t = 0; t < s.tensors.size(); ++t) {
        const std::string& bytes = shards[step - 1].data[t];
        EXPECT_EQ(s.tensors[t].digest, DigestHex(want, bytes.data(), bytes.size()));
      }
      EXPECT_TRUE(c->Verify("dg", step).ok());
      auto got = RestoreToString(c.get(), "dg", step, 0);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == shards[step - 1].Payload());
    }
    c.reset();
    EXPECT_EQ(server.Stop(), 0);
  }
  ServerProcess bad(GRADSNAP_SERVER_BIN);
  EXPECT_FALSE(bad.StartOn(dir.File("data"), "127.0.0.1:0", {"--digest", "md5"}).ok());
  EXPECT_NE(bad.Wait(), 0);
  ServerProcess bad_interval(GRADSNAP_SERVER_BIN);
  EXPECT_FALSE(
      bad_interval.StartOn(dir.File("data"), "127.0.0.1:0", {"--durable-every-mib", "0"}).ok());
  EXPECT_NE(bad_interval.Wait(), 0);
  // A word without its flag (here --listen forgotten before an address) is refused, as are
  // negative durations.
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"127.0.0.1:5999"},
        std::vector<std::string>{"--keepalive-ms", "-1"},
        std::vector<std::string>{"--shutdown-grace-ms", "-5"}}) {
    ServerProcess refused(GRADSNAP_SERVER_BIN);
    EXPECT_FALSE(refused.StartOn(dir.File("data"), "127.0.0.1:0", extra).ok()) << extra[0];
    EXPECT_NE(refused.Wait(), 0) << extra[0];
  }
}

TEST(ServiceE2E, TwoNodesWithPlacementAndReplicaFailover) {
  TempDir dir;
  ServerProcess a(GRADSNAP_SERVER_BIN), b(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(a.StartOn(dir.File("a")).ok());
  ASSERT_TRUE(b.StartOn(dir.File("b")).ok());
  constexpr int kRanks = 4;
  std::vector<TestShard> shards;
  {
    // One copy per shard: ranks spread over the two nodes; each node commits with placeholders.
    auto c = Connect({a.address(), b.address()}, 1);
    ASSERT_TRUE(c->BeginCheckpoint(FullSpec("placed", 5, kRanks)).ok());
    for (int r = 0; r < kRanks; ++r) {
      shards.push_back(MakeShard("placed", 5, r, {1 << 20, 4096}, 3));
      ASSERT_TRUE(c->SaveShard(shards[r].spec, shards[r].Refs()).ok());
    }
    auto m = c->Show("placed", 5);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->shards.size(), static_cast<size_t>(kRanks));
    for (const auto& s : m->shards) EXPECT_EQ(s.tensors.size(), 2u);
    EXPECT_EQ(m->info.state, client::CheckpointState::kCommitted);
    for (int r = 0; r < kRanks; ++r) {
      auto got = RestoreToString(c.get(), "placed", 5, r);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == shards[r].Payload());
    }
    EXPECT_TRUE(c->Verify("placed", 5).ok());
  }
  {
    // Two copies: after node b dies every shard still restores from a.
    auto c = Connect({a.address(), b.address()}, 2);
    ASSERT_TRUE(c->BeginCheckpoint(FullSpec("placed", 6, kRanks)).ok());
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(c->SaveShard(MakeShard("placed", 6, r, {1 << 20}, 4).spec,
                               MakeShard("placed", 6, r, {1 << 20}, 4).Refs())
                      .ok());
    }
  }
  b.Signal(SIGKILL);
  b.Wait();
  ClientOptions o;
  o.endpoints = {a.address(), b.address()};
  o.replicas = 2;
  o.max_attempts = 2;
  auto c = client::NewRemoteClient(o);
  ASSERT_TRUE(c.ok());
  for (int r = 0; r < kRanks; ++r) {
    auto got = RestoreToString(c->get(), "placed", 6, r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == MakeShard("placed", 6, r, {1 << 20}, 4).Payload());
  }
  auto listed = (*c)->List("placed");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 2u);
  EXPECT_FALSE((*c)->Health().ok());
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
