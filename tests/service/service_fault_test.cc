// Faults against real gradsnap-server processes: SIGKILL in the middle of an upload and a
// restart (the client's retry resumes from the committed offset and the checkpoint verifies),
// SIGTERM during an upload, and a client that disconnects mid-stream. Never a partial
// checkpoint listed.
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "client/backends.h"
#include "client/client.h"
#include "client/remote_placement.h"
#include "common/clock.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/gradsnap.grpc.pb.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

namespace v1 = ::gradsnap::v1;

// Tries per call: the backoff reaches 2 s, so a client rides out a restart of several seconds.
constexpr int kRideOutRestart = 40;

// Waits (up to 60 s) until the server has received more than `bytes` upload bytes.
bool WaitForBytesIn(const ServerProcess& server, double bytes) {
  Stopwatch w;
  while (w.ElapsedSeconds() < 60) {
    auto body = HttpGet(server.metrics_port());
    if (body.ok() && MetricValue(*body, "gradsnap_bytes_in_total") > bytes) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::vector<std::string> ServerArgs(const TempDir& dir, int port, const std::string& extra = "") {
  std::vector<std::string> args = {"--data-dir", dir.File("data"), "--listen",
                                   "127.0.0.1:" + std::to_string(port), "--metrics-listen",
                                   "127.0.0.1:0", "--zstd-level", "0"};
  if (!extra.empty()) {
    args.push_back("--shutdown-grace-ms");
    args.push_back(extra);
  }
  return args;
}

void ExpectNothingListedOrVerified(client::Client* c, const std::string& job) {
  auto listed = c->List(job);
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const auto& info : *listed) {
    EXPECT_TRUE(c->Verify(job, info.step).ok()) << "listed step " << info.step;
  }
}

TEST(ServiceFault, SigkillMidUploadRestartAndResume) {
  TempDir dir;
  auto server = std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server->Start(ServerArgs(dir, 0)).ok());
  const int port = server->port();
  auto c = ConnectTo(server->address(), kRideOutRestart);
  constexpr uint64_t kBytes = 384u << 20;
  TestShard shard = MakeShard("killed", 1, 0, {kBytes - (1 << 20), 1 << 20}, 11);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("killed", 1, 1)).ok());
  std::future<absl::Status> save = c->SaveShardAsync(shard.spec, shard.Refs());
  ASSERT_TRUE(WaitForBytesIn(*server, 100 << 20));
  server->Signal(SIGKILL);
  EXPECT_EQ(server->Wait(), 128 + SIGKILL);
  server = std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server->Start(ServerArgs(dir, port)).ok()) << "restart on port " << port;
  // After the restart nothing partial is listed.
  {
    auto other = ConnectTo(server->address(), kRideOutRestart);
    auto listed = other->List("killed");
    ASSERT_TRUE(listed.ok());
    EXPECT_TRUE(listed->empty() || save.wait_for(std::chrono::seconds(0)) ==
                                       std::future_status::ready);
  }
  absl::Status s = save.get();
  ASSERT_TRUE(s.ok()) << s << "\nserver " << server->Describe() << ", log:\n" << server->Log();
  EXPECT_TRUE(c->Verify("killed", 1).ok());
  auto got = RestoreToString(c.get(), "killed", 1, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == shard.Payload());
  // The retry resumed from the durable offset instead of resending everything.
  auto body = HttpGet(server->metrics_port());
  ASSERT_TRUE(body.ok());
  EXPECT_LT(MetricValue(*body, "gradsnap_bytes_in_total"), static_cast<double>(kBytes));
}

// Rank 0 of (job, step 1) restores through `c` whole and equal to `shard`'s one tensor.
void ExpectRestoresWhole(client::Client* c, const std::string& job, const TestShard& shard) {
  auto whole = RestoreToString(c, job, 1, 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(*whole == shard.data[0]);
}

// Saves `job` step 1 rank 0 (one tensor of `bytes`) through a client of `server` that tries
// each call `attempts` times; returns the shard.
TestShard SaveOneShard(const ServerProcess& server, int attempts, const std::string& job,
                       uint64_t bytes, uint64_t seed) {
  auto c = ConnectTo(server.address(), attempts);
  EXPECT_NE(c, nullptr);
  TestShard shard = MakeShard(job, 1, 0, {bytes}, seed);
  if (c == nullptr) return shard;
  EXPECT_TRUE(c->BeginCheckpoint(FullSpec(job, 1, 1)).ok());
  EXPECT_TRUE(c->SaveShard(shard.spec, shard.Refs()).ok());
  return shard;
}

// A node frozen mid-restore (SIGSTOP: the kernel keeps the connection, so TCP alone would
// wait for ever) is given up on after rpc_timeout_ms without data: one clear UNAVAILABLE with
// a single attempt allowed (with more, the next attempt would resume from the byte reached);
// thawed, the same client restores the shard whole.
TEST(ServiceFault, FrozenNodeMidRestoreIsCancelledNotWaitedFor) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.Start(ServerArgs(dir, 0)).ok());
  TestShard shard = SaveOneShard(server, kRideOutRestart, "frozen", 24u << 20, 5);
  client::ClientOptions o;
  o.endpoints = {server.address()};
  o.rpc_timeout_ms = 1000;
  o.max_attempts = 1;
  auto rc = client::Client::ConnectRemote(o);
  ASSERT_TRUE(rc.ok()) << rc.status();
  std::atomic<bool> stopped{false};
  Stopwatch w;
  auto restore = std::async(std::launch::async, [&] {
    return (*rc)->RestoreShard("frozen", 1, 0, [&](const void*, size_t) {
      if (!stopped.exchange(true)) server.Signal(SIGSTOP);  // frozen after the first bytes
      return absl::OkStatus();
    });
  });
  const bool returned = restore.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  server.Signal(SIGCONT);  // also lets a restore that waited on finish, so the test ends
  absl::Status s = restore.get();
  ASSERT_TRUE(returned) << "the restore waited 30 s for a frozen node";
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("stalled"), std::string::npos) << s;
  EXPECT_GE(w.ElapsedSeconds(), 1.0);
  ExpectRestoresWhole(rc->get(), "frozen", shard);
}

// Two gradsnap-servers on fresh directories; `status` says whether both started.
struct TwoNodes {
  TwoNodes() {
    for (int i = 0; i < 2 && status.ok(); ++i) {
      status = node[i].Start(ServerArgs(dir[i], 0));
      endpoints.push_back(node[i].address());
    }
  }
  TempDir dir[2];
  ServerProcess node[2] = {ServerProcess(GRADSNAP_SERVER_BIN), ServerProcess(GRADSNAP_SERVER_BIN)};
  absl::Status status;
  std::vector<std::string> endpoints;  // node 0's address, node 1's
};

// Two nodes holding rank 0 of one step; `second_seed` != `first_seed` gives the second node
// another version of it (the step deleted on one node and saved again there). A client of both
// restores it while the node it reads from first is SIGKILLed after the first bytes.
struct FailoverRun {
  absl::Status status;
  std::string bytes;
  std::string first_version, second_version;  // what each node held
  double second_bytes_out = -1;  // payload bytes the node failed over to sent
};
FailoverRun RestoreAcrossAFailover(uint64_t first_seed, uint64_t second_seed) {
  FailoverRun run;
  TwoNodes n;
  EXPECT_TRUE(n.status.ok()) << n.status;
  if (!n.status.ok()) return run;
  const std::vector<std::string>& endpoints = n.endpoints;
  const std::vector<size_t> order = PlacementOrder(endpoints, "rep", 0);
  ServerProcess* first = &n.node[order[0]];
  ServerProcess* second = &n.node[order[1]];
  const uint64_t seeds[2] = {order[0] == 0 ? first_seed : second_seed,
                             order[0] == 0 ? second_seed : first_seed};
  for (size_t i = 0; i < 2; ++i) {  // each node saved on its own
    auto c = ConnectTo(endpoints[i], kRideOutRestart);
    TestShard shard = MakeShard("rep", 1, 0, {24u << 20}, seeds[i]);
    EXPECT_TRUE(c->BeginCheckpoint(FullSpec("rep", 1, 1)).ok());
    EXPECT_TRUE(c->SaveShard(shard.spec, shard.Refs()).ok());
    (i == order[0] ? run.first_version : run.second_version) = shard.data[0];
  }
  client::ClientOptions o;
  o.endpoints = endpoints;
  o.max_attempts = 3;
  auto c = client::Client::ConnectRemote(o);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return run;
  bool killed = false;
  run.status = (*c)->RestoreShard("rep", 1, 0, [&](const void* p, size_t n) {
    run.bytes.append(static_cast<const char*>(p), n);
    if (!killed) {
      killed = true;
      first->Signal(SIGKILL);
    }
    return absl::OkStatus();
  });
  first->Wait();
  auto body = HttpGet(second->metrics_port());
  if (body.ok()) run.second_bytes_out = MetricValue(*body, "gradsnap_bytes_out_total");
  return run;
}

// The stream broke inside the shard's one tensor: the replica resumes at that tensor's start
// (the bytes before the break are read again, not delivered twice), so it sees the tensor whole
// and checks its digest.
TEST(ServiceFault, RestoreFailsOverToAReplicaMidStream) {
  FailoverRun run = RestoreAcrossAFailover(7, 7);
  ASSERT_EQ(run.first_version, run.second_version);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(run.bytes == run.first_version);
  EXPECT_EQ(run.second_bytes_out, static_cast<double>(24u << 20));
}

// Replicas that disagree (a step saved again on one node only) are never mixed: the restore
// that began on one version does not continue on the other.
TEST(ServiceFault, DivergedReplicasAreNotMixedOnFailover) {
  FailoverRun run = RestoreAcrossAFailover(7, 8);
  ASSERT_NE(run.first_version, run.second_version);
  if (run.status.ok()) {
    EXPECT_TRUE(run.bytes == run.first_version || run.bytes == run.second_version)
        << "a restore returned bytes of two versions of one shard";
  } else {
    EXPECT_EQ(run.status.code(), absl::StatusCode::kAborted) << run.status;
    EXPECT_NE(run.status.message().find("another version"), std::string::npos) << run.status;
  }
}

// Static lists place by node id, not by how an endpoint is spelled: a client of three real
// nodes as 127.0.0.1:P and one of the same nodes as localhost:P (in another order) put each
// rank's one copy on the same node; two spellings of one node in one list are refused.
TEST(ServiceFault, StaticPlacementFollowsNodeIdsNotEndpointSpelling) {
  TempDir dir[3];
  ServerProcess node[3] = {ServerProcess(GRADSNAP_SERVER_BIN), ServerProcess(GRADSNAP_SERVER_BIN),
                           ServerProcess(GRADSNAP_SERVER_BIN)};
  std::vector<std::string> numeric, named;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(node[i].Start(ServerArgs(dir[i], 0)).ok()) << node[i].Log();
    const std::string port = node[i].address().substr(node[i].address().rfind(':') + 1);
    numeric.push_back("127.0.0.1:" + port);
    named.insert(named.begin(), "localhost:" + port);  // reversed: order plays no part either
  }
  constexpr int32_t kRanks = 8;
  auto save = [&](const std::vector<std::string>& endpoints, int64_t step) {
    client::ClientOptions o;
    o.endpoints = endpoints;
    o.replicas = 1;
    o.max_attempts = 2;
    auto c = client::Client::ConnectRemote(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->BeginCheckpoint(FullSpec("spell", step, kRanks)).ok());
    for (int32_t r = 0; r < kRanks; ++r) {
      TestShard shard = MakeShard("spell", step, r, {64 << 10}, step * 100 + r);
      absl::Status s = (*c)->SaveShard(shard.spec, shard.Refs());
      ASSERT_TRUE(s.ok()) << s;
    }
  };
  save(numeric, 1);
  save(named, 2);
  // The node of each rank's real copy (the others hold placeholders, which do not restore),
  // asked node by node.
  std::map<int64_t, std::map<int32_t, int>> holder;
  for (int i = 0; i < 3; ++i) {
    auto c = ConnectTo(numeric[i], 1);
    for (int64_t step : {1, 2}) {
      for (int32_t r = 0; r < kRanks; ++r) {
        auto back = RestoreToString(c.get(), "spell", step, r);
        if (!back.ok() || back->empty()) continue;
        EXPECT_EQ(holder[step].count(r), 0u) << "step " << step << " rank " << r;
        holder[step][r] = i;
      }
    }
  }
  std::set<int> used;
  for (int32_t r = 0; r < kRanks; ++r) {
    ASSERT_EQ(holder[1].count(r), 1u) << r;
    EXPECT_EQ(holder[2][r], holder[1][r]) << "rank " << r;
    used.insert(holder[1][r]);
  }
  EXPECT_GE(used.size(), 2u);  // a real spread, not one node for everything
  client::ClientOptions twice;
  twice.endpoints = {numeric[0], "localhost:" + numeric[0].substr(numeric[0].rfind(':') + 1)};
  twice.max_attempts = 1;
  auto keys = client::StaticPlacementKeys(twice);
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument) << keys.status();
  EXPECT_NE(keys.status().message().find("one node"), absl::string_view::npos) << keys.status();
}

// A node comes back with an older copy of its data (a restore from backup, a swapped disk): the
// ranks it held of the newer checkpoint are gone, and the other node holds only placeholders of
// them. That checkpoint reads as DATA_LOSS (Show, Verify), never as a committed checkpoint of
// 0 bytes; the older one is whole. While the node is down, nothing is concluded.
TEST(ServiceFault, CheckpointWhoseRankNoNodeHoldsIsDataLoss) {
  TwoNodes n;
  ASSERT_TRUE(n.status.ok()) << n.status;
  // The node holding rank 0 (one replica) loses its newer data.
  const size_t holder = PlacementOrder(n.endpoints, "lost", 0)[0];
  ServerProcess& loser = n.node[holder];
  const TempDir& loser_dir = n.dir[holder];
  client::ClientOptions o;
  o.endpoints = n.endpoints;
  o.max_attempts = kRideOutRestart;
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto save = [&](int64_t step) {
    ASSERT_TRUE((*c)->BeginCheckpoint(FullSpec("lost", step, 4)).ok());
    for (int32_t r = 0; r < 4; ++r) {
      TestShard shard = MakeShard("lost", step, r, {1 << 20}, step * 10 + r);
      ASSERT_TRUE((*c)->SaveShard(shard.spec, shard.Refs()).ok());
    }
  };
  save(1);
  loser.Kill();
  std::filesystem::copy(loser_dir.File("data"), loser_dir.File("backup"),
                        std::filesystem::copy_options::recursive);
  ASSERT_TRUE(loser.Restart().ok());
  save(2);
  loser.Kill();
  std::filesystem::remove_all(loser_dir.File("data"));
  std::filesystem::rename(loser_dir.File("backup"), loser_dir.File("data"));
  ASSERT_TRUE(loser.Restart().ok());
  auto shown = (*c)->Show("lost", 2);
  EXPECT_EQ(shown.status().code(), absl::StatusCode::kDataLoss) << shown.status();
  EXPECT_NE(shown.status().message().find("rank 0: no node holds its data"), std::string::npos)
      << shown.status();
  absl::Status verified = (*c)->Verify("lost", 2);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  ASSERT_TRUE((*c)->Show("lost", 1).ok());
  EXPECT_TRUE((*c)->Verify("lost", 1).ok());
  // The node down: its ranks may be there; nothing is concluded from the others alone.
  loser.Kill();
  client::ClientOptions quick = o;
  quick.max_attempts = 1;
  auto q = client::Client::ConnectRemote(quick);
  ASSERT_TRUE(q.ok());
  auto partial = (*q)->Show("lost", 2);
  EXPECT_NE(partial.status().code(), absl::StatusCode::kDataLoss) << partial.status();
}

// A node where the step is still pending (nodes commit when each holds every rank) does not
// stop a restore: the committed replica serves it.
TEST(ServiceFault, RestoreSkipsANodeWhereTheStepIsNotCommittedYet) {
  TwoNodes n;
  ASSERT_TRUE(n.status.ok()) << n.status;
  const std::vector<std::string>& endpoints = n.endpoints;
  const std::vector<size_t> order = PlacementOrder(endpoints, "pend", 0);
  auto pending = ConnectTo(endpoints[order[0]], kRideOutRestart);
  ASSERT_TRUE(pending->BeginCheckpoint(FullSpec("pend", 1, 1)).ok());  // nothing saved there
  auto holder = ConnectTo(endpoints[order[1]], kRideOutRestart);
  TestShard shard = MakeShard("pend", 1, 0, {3u << 20}, 4);
  ASSERT_TRUE(holder->BeginCheckpoint(FullSpec("pend", 1, 1)).ok());
  ASSERT_TRUE(holder->SaveShard(shard.spec, shard.Refs()).ok());
  client::ClientOptions o;
  o.endpoints = endpoints;
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectRestoresWhole(c->get(), "pend", shard);
  // Where no node has it committed, the answer is the node's, at once.
  auto nowhere = ConnectTo(endpoints[order[0]], 1);
  auto refused = RestoreToString(nowhere.get(), "pend", 1, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
}

// A save to a node frozen for a while (SIGSTOP) runs into its deadlines and is retried, not
// failed: once the node is thawed the upload completes and reads back exact.
TEST(ServiceFault, UploadOutlastsANodeFrozenPastItsDeadline) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.Start(ServerArgs(dir, 0)).ok());
  client::ClientOptions o;
  o.endpoints = {server.address()};
  o.rpc_timeout_ms = 300;
  o.max_attempts = 8;  // backoff 0.1, 0.2, 0.4, 0.8, 1.6, 2 s: longer than the freeze
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  TestShard shard = MakeShard("thaw", 1, 0, {6u << 20}, 2);
  ASSERT_TRUE((*c)->BeginCheckpoint(FullSpec("thaw", 1, 1)).ok());
  server.Signal(SIGSTOP);
  std::thread thaw([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    server.Signal(SIGCONT);
  });
  absl::Status saved = (*c)->SaveShard(shard.spec, shard.Refs());
  thaw.join();
  ASSERT_TRUE(saved.ok()) << saved;
  ExpectRestoresWhole(c->get(), "thaw", shard);
}

// A restore's sink that fails (its destination gone) ends the restore with the sink's own
// error at once: not taken for a node failure, so no piece is offered to it twice.
TEST(ServiceFault, RestoreSinkErrorIsReturnedNotRetried) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.Start(ServerArgs(dir, 0)).ok());
  TestShard shard = SaveOneShard(server, 8, "sink", 6u << 20, 3);
  auto c = ConnectTo(server.address(), 8);
  ASSERT_NE(c, nullptr);
  int calls = 0;
  absl::Status s = c->RestoreShard("sink", 1, 0, [&](const void*, size_t) {
    ++calls;
    return absl::UnavailableError("destination disk went away");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("destination disk went away"), std::string::npos) << s;
  EXPECT_EQ(calls, 1);
}

// A begin that reached one node of two (its client killed during the fan-out) is abandoned
// through a client of both: the node without it is no error.
TEST(ServiceFault, AbortOfAStepBegunOnSomeNodesOnly) {
  TwoNodes n;
  ASSERT_TRUE(n.status.ok()) << n.status;
  auto only_a = ConnectTo(n.endpoints[0], 2);
  ASSERT_TRUE(only_a->BeginCheckpoint(FullSpec("half", 1, 1)).ok());
  client::ClientOptions o;
  o.endpoints = n.endpoints;
  auto both = client::Client::ConnectRemote(o);
  ASSERT_TRUE(both.ok()) << both.status();
  absl::Status s = (*both)->AbortCheckpoint("half", 1);
  EXPECT_TRUE(s.ok()) << s;
  auto pending = only_a->List("half", /*include_pending=*/true);
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_TRUE(pending->empty());
  // Begun nowhere: NOT_FOUND, as with one node.
  EXPECT_EQ((*both)->AbortCheckpoint("half", 2).code(), absl::StatusCode::kNotFound);
}

// gc over two nodes decides from a verify of every rank where it is held: with rank 1 of FULL
// 30 damaged on its node, keep_last 1 keeps 30 (damaged, not counted) and 20 (the one a restore
// falls back to) on both nodes. Each node deciding alone, the node of rank 0 saw 30 verify and
// deleted its rank 0 of 20. Once a good FULL 40 is there, the same gc deletes 20 and 30 on both.
TEST(ServiceFault, GcOverTwoNodesKeepsWhatLatestFallsBackTo) {
  TwoNodes n;
  ASSERT_TRUE(n.status.ok()) << n.status;
  const std::string job = JobWithRanksApart(n.endpoints);
  ASSERT_FALSE(job.empty());
  client::ClientOptions o;
  o.endpoints = n.endpoints;
  o.max_attempts = 3;
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  std::map<int64_t, std::vector<TestShard>> saved;
  auto save = [&](int64_t step) {
    ASSERT_TRUE((*c)->BeginCheckpoint(FullSpec(job, step, 2)).ok());
    for (int32_t r = 0; r < 2; ++r) {
      saved[step].push_back(MakeShard(job, step, r, {1 << 20}, step * 10 + r));
      ASSERT_TRUE((*c)->SaveShard(saved[step].back().spec, saved[step].back().Refs()).ok());
    }
  };
  save(20);
  save(30);
  const size_t rank1_node = PlacementOrder(n.endpoints, job, 1)[0];
  ASSERT_EQ(FlipSegmentBytes(n.dir[rank1_node].File("data"), job, 30, 1), 1);
  ASSERT_EQ((*c)->Verify(job, 30).code(), absl::StatusCode::kDataLoss);
  client::GcPolicy keep_one;
  keep_one.keep_last = 1;
  auto gc = (*c)->Gc(job, keep_one);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_TRUE(gc->deleted_steps.empty());
  EXPECT_TRUE((*c)->Verify(job, 20).ok());
  for (int32_t r = 0; r < 2; ++r) {
    auto got = RestoreToString(c->get(), job, 20, r);
    ASSERT_TRUE(got.ok()) << "rank " << r << ": " << got.status();
    EXPECT_TRUE(*got == saved[20][r].Payload()) << "rank " << r;
  }
  save(40);
  gc = (*c)->Gc(job, keep_one);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->deleted_steps, (std::vector<int64_t>{20, 30}));
  for (const std::string& e : n.endpoints) {  // gone from each node, rank and placeholder
    auto listed = ConnectTo(e, 2)->List(job, /*include_pending=*/true);
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->size(), 1u) << e;
    EXPECT_EQ(listed->front().step, 40) << e;
  }
}

// Placeholders carry the writer's epoch: a zombie whose real copy lands on a node that has not
// heard of the newer attempt commits nothing on a node that has (before, its placeholder went
// as epoch 0, unfenced, and completed the step there). Delete is fenced through the wire too.
TEST(ServiceFault, PlaceholderOfASupersededWriterIsRefused) {
  TwoNodes n;
  ASSERT_TRUE(n.status.ok()) << n.status;
  const std::vector<size_t> order = PlacementOrder(n.endpoints, "zomb", 0);
  client::ClientOptions o;
  o.endpoints = n.endpoints;
  o.max_attempts = 2;
  auto zombie = client::Client::ConnectRemote(o);
  ASSERT_TRUE(zombie.ok()) << zombie.status();
  auto old_epoch = (*zombie)->AcquireEpoch("zomb");
  ASSERT_TRUE(old_epoch.ok()) << old_epoch.status();
  client::CheckpointSpec spec = FullSpec("zomb", 1, 1);
  spec.epoch = *old_epoch;
  ASSERT_TRUE((*zombie)->BeginCheckpoint(spec).ok());
  // The newer attempt, seen on the placeholder's node only.
  auto placeholder_node = ConnectTo(n.endpoints[order[1]], 2);
  ASSERT_TRUE(placeholder_node->AcquireEpoch("zomb").ok());
  TestShard shard = MakeShard("zomb", 1, 0, {1 << 20}, 3);
  shard.spec.epoch = *old_epoch;
  absl::Status saved = (*zombie)->SaveShard(shard.spec, shard.Refs());
  EXPECT_EQ(saved.code(), absl::StatusCode::kFailedPrecondition) << saved;
  EXPECT_NE(saved.message().find("superseded"), std::string::npos) << saved;
  auto listed = placeholder_node->List("zomb");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty()) << "the zombie's step committed on the fenced node";
  absl::Status deleted = placeholder_node->Delete("zomb", 1, *old_epoch);
  EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition) << deleted;
  EXPECT_NE(deleted.message().find("superseded"), std::string::npos) << deleted;
}

// A hostile read_limit near 2^64 does not wrap the read budget's reservation to nothing: the
// read holds its read-ahead reservation (metric gradsnap_read_inflight_bytes) like any read.
TEST(ServiceFault, HugeReadLimitStillReservesTheReadBudget) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.Start(ServerArgs(dir, 0)).ok());
  SaveOneShard(server, 2, "huge", 24u << 20, 6);
  auto stub = RawStub(server.address());
  grpc::ClientContext ctx;
  v1::ReadRequest req;
  req.set_job("huge");
  req.set_step(1);
  req.set_rank(0);
  req.set_read_limit(UINT64_MAX - (9u << 20) + 1);  // + 1 MiB message + 8 MiB slack: 2^64
  auto reader = stub->Read(&ctx, req);
  v1::ReadResponse resp;
  ASSERT_TRUE(reader->Read(&resp));  // the read is under way (and held there by flow control)
  auto body = HttpGet(server.metrics_port());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_GE(MetricValue(*body, "gradsnap_read_inflight_bytes"), double{9u << 20});
  ctx.TryCancel();
  reader->Finish().IgnoreError();
}

// A client frozen mid-upload (SIGSTOP, its stream open) does not hold its shard: the server's
// keepalive ping goes unanswered, the connection is closed, and another writer of the shard
// (here the same spec, as a restarted rank) gets it within seconds.
TEST(ServiceFault, FrozenUploaderFreesItsShard) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  std::vector<std::string> args = ServerArgs(dir, 0);
  args.insert(args.end(), {"--keepalive-ms", "1500"});
  ASSERT_TRUE(server.Start(args).ok());
  auto c = ConnectTo(server.address(), 10);  // about 12 s of backoff on ABORTED
  ASSERT_NE(c, nullptr);
  const uint64_t bytes = 8u << 20;
  TestShard shard = MakeShard("frozenup", 1, 0, {bytes}, 9);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("frozenup", 1, 1)).ok());
  const std::string port = server.address().substr(server.address().rfind(':') + 1);
  const std::string address = server.address(), sz = std::to_string(bytes);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(GRADSNAP_STALLED_WRITER_BIN, "stalled_writer", address.c_str(), "frozenup", "1",
            sz.c_str(), "9", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the writer did not freeze mid-upload";
  Stopwatch w;
  absl::Status saved = c->SaveShard(shard.spec, shard.Refs());
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_LT(w.ElapsedSeconds(), 30.0);
  ExpectRestoresWhole(c.get(), "frozenup", shard);
}

// The writer epoch of an abort crosses the wire: a superseded attempt's abort is refused by
// the server, the current attempt's goes through.
TEST(ServiceFault, AbortCarriesItsEpoch) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.Start(ServerArgs(dir, 0)).ok());
  auto c = ConnectTo(server.address(), 2);
  ASSERT_NE(c, nullptr);
  const uint64_t older = *c->AcquireEpoch("ep");
  const uint64_t current = *c->AcquireEpoch("ep");
  ASSERT_GT(current, older);
  client::CheckpointSpec spec = FullSpec("ep", 3, 1);
  spec.epoch = current;
  ASSERT_TRUE(c->BeginCheckpoint(spec).ok());
  absl::Status old_attempt = c->AbortCheckpoint("ep", 3, older);
  EXPECT_EQ(old_attempt.code(), absl::StatusCode::kFailedPrecondition) << old_attempt;
  EXPECT_NE(old_attempt.message().find("superseded"), std::string::npos) << old_attempt;
  EXPECT_TRUE(c->AbortCheckpoint("ep", 3, current).ok());
}

TEST(ServiceFault, SigtermDuringUploadThenRetryCompletes) {
  TempDir dir;
  auto server = std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server->Start(ServerArgs(dir, 0, "100")).ok());
  const int port = server->port();
  auto c = ConnectTo(server->address(), kRideOutRestart);
  TestShard r0 = MakeShard("termed", 2, 0, {256u << 20}, 5);
  TestShard r1 = MakeShard("termed", 2, 1, {1 << 20}, 5);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("termed", 2, 2)).ok());
  ASSERT_TRUE(c->SaveShard(r1.spec, r1.Refs()).ok());
  std::future<absl::Status> save = c->SaveShardAsync(r0.spec, r0.Refs());
  ASSERT_TRUE(WaitForBytesIn(*server, 40 << 20));
  EXPECT_EQ(server->Stop(), 0) << server->Log();  // clean exit within the grace period
  server = std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server->Start(ServerArgs(dir, port)).ok());
  {
    auto other = ConnectTo(server->address(), kRideOutRestart);
    auto pending = other->List("termed", /*include_pending=*/true);
    ASSERT_TRUE(pending.ok());
    ExpectNothingListedOrVerified(other.get(), "termed");
  }
  absl::Status s = save.get();
  ASSERT_TRUE(s.ok()) << s << "\nserver " << server->Describe() << ", log:\n" << server->Log();
  auto listed = c->List("termed");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE(c->Verify("termed", 2).ok());
  auto got = RestoreToString(c.get(), "termed", 2, 0);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == r0.Payload());
  EXPECT_EQ(server->Stop(), 0);
}

// Attempt 1 of a one-rank job: a server on a fresh directory, a client of it, FULL `step` begun
// under attempt 1's epoch, rank 0's shard (`bytes`, seed 1) made under that epoch but not sent,
// and a raw stub to send it as attempt 1's zombie would. `status` says whether all that worked.
struct FirstAttempt {
  FirstAttempt(const std::string& job, int64_t step, uint64_t bytes, int max_attempts)
      : job(job), step(step) {
    status = server.Start(ServerArgs(dir, 0));
    if (!status.ok()) return;
    c = ConnectTo(server.address(), max_attempts);
    absl::StatusOr<uint64_t> e = c->AcquireEpoch(job);
    if (!e.ok()) {
      status = e.status();
      return;
    }
    epoch = *e;
    client::CheckpointSpec cspec = FullSpec(job, step, 1);
    cspec.epoch = epoch;
    status = c->BeginCheckpoint(cspec);
    shard = MakeShard(job, step, 0, {bytes}, 1);
    shard.spec.epoch = epoch;
    stub = RawStub(server.address());
  }
  // Attempt 2 (writer `epoch`) saves rank 0's shard with other bytes; the shard it saved.
  absl::StatusOr<TestShard> SaveAgain(uint64_t new_epoch) {
    TestShard again = MakeShard(job, step, 0, {shard.spec.tensors[0].byte_length}, 2);
    again.spec.epoch = new_epoch;
    RETURN_IF_ERROR(c->SaveShard(again.spec, again.Refs()));
    return again;
  }
  // Whether rank 0's shard restores to exactly `expected`'s bytes.
  ::testing::AssertionResult Holds(const TestShard& expected) {
    absl::StatusOr<std::string> got = RestoreToString(c.get(), job, step, 0);
    if (!got.ok()) return ::testing::AssertionFailure() << got.status();
    if (*got != expected.Payload()) return ::testing::AssertionFailure() << "other bytes";
    return ::testing::AssertionSuccess();
  }

  const std::string job;
  const int64_t step;
  TempDir dir;
  ServerProcess server{GRADSNAP_SERVER_BIN};
  absl::Status status;
  std::unique_ptr<client::Client> c;
  uint64_t epoch = 0;
  TestShard shard;
  std::unique_ptr<v1::Storage::Stub> stub;
};

// Attempt 1 left 5 MiB of its shard durable (its stream cut without finish_write); attempt 2
// saves the same step with other bytes. Its client is told there is nothing to resume for it,
// and the server starts the shard over: the committed shard holds attempt 2's bytes only, not
// attempt 1's prefix followed by attempt 2's rest.
TEST(ServiceFault, NewAttemptDoesNotResumeAnOlderAttemptsBytes) {
  FirstAttempt a("twice", 3, 8u << 20, kRideOutRestart);
  ASSERT_TRUE(a.status.ok()) << a.status;
  {
    grpc::ClientContext ctx;
    v1::WriteResponse resp;
    auto stream = a.stub->Write(&ctx, &resp);
    ASSERT_TRUE(SendRawPrefix(stream.get(), a.shard, 5u << 20));
    stream->WritesDone();  // ends without finish_write: what arrived is made durable
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(resp.committed_size(), 5u << 20);
  }
  const uint64_t second = *a.c->AcquireEpoch("twice");
  absl::StatusOr<uint64_t> resumable = QueryCommittedSize(a.stub.get(), "twice", 3, 0, second);
  ASSERT_TRUE(resumable.ok()) << resumable.status();
  EXPECT_EQ(*resumable, 0u);  // nothing of attempt 1 is attempt 2's to resume
  absl::StatusOr<TestShard> saved = a.SaveAgain(second);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(a.Holds(*saved)) << "attempt 1's prefix was resumed";
  EXPECT_TRUE(a.c->Verify("twice", 3).ok());
}

// A zombie of attempt 1 keeps its upload stream of a shard open (alive, silent); attempt 2's
// upload of the same shard cancels it instead of being refused ("another stream is writing")
// until the zombie's stream dies on its own, and commits its own bytes.
TEST(ServiceFault, NewAttemptCancelsAnOlderAttemptsOpenUpload) {
  FirstAttempt a("zombie", 4, 4u << 20, 3);  // the old server answered ABORTED to every try
  ASSERT_TRUE(a.status.ok()) << a.status;
  grpc::ClientContext zombie_ctx;
  v1::WriteResponse zombie_resp;
  auto zombie = a.stub->Write(&zombie_ctx, &zombie_resp);
  ASSERT_TRUE(SendRawPrefix(zombie.get(), a.shard, 1 << 20));
  // The zombie's stream now holds the shard; wait until the server has its first message.
  Stopwatch w;
  while (w.ElapsedSeconds() < 30 && MetricValue(*HttpGet(a.server.metrics_port()),
                                               "gradsnap_bytes_in_total") < (1 << 20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  absl::StatusOr<TestShard> saved = a.SaveAgain(*a.c->AcquireEpoch("zombie"));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(a.Holds(*saved));
  // The zombie's stream was ended by the server.
  EXPECT_FALSE(zombie->Finish().ok());
}

TEST(ServiceFault, ClientDisconnectMidStreamLeavesNothingListed) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.Start(ServerArgs(dir, 0)).ok());
  auto c = ConnectTo(server.address(), kRideOutRestart);
  TestShard shard = MakeShard("dropped", 3, 0, {8u << 20}, 8);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("dropped", 3, 1)).ok());
  auto stub = RawStub(server.address());
  {
    grpc::ClientContext ctx;
    v1::WriteResponse resp;
    auto stream = stub->Write(&ctx, &resp);
    ASSERT_TRUE(SendRawPrefix(stream.get(), shard, 5u << 20));
    ctx.TryCancel();  // vanish without finish_write
    EXPECT_FALSE(stream->Finish().ok());
  }
  auto listed = c->List("dropped");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // The server kept what arrived (flushed, resumable) and the client completes from there.
  v1::QueryWriteStatusRequest q;
  q.set_job("dropped");
  q.set_step(3);
  v1::QueryWriteStatusResponse qr;
  Stopwatch w;
  while (w.ElapsedSeconds() < 60) {  // the server notices the cancel asynchronously
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->QueryWriteStatus(&ctx, q, &qr).ok());
    if (qr.committed_size() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(qr.committed_size(), 0u) << "the server dropped what arrived before the disconnect";
  EXPECT_LE(qr.committed_size(), 5u << 20);
  EXPECT_FALSE(qr.complete());
  auto before = HttpGet(server.metrics_port());
  ASSERT_TRUE(before.ok()) << before.status();
  const double received = MetricValue(*before, "gradsnap_bytes_in_total");
  ASSERT_TRUE(c->SaveShard(shard.spec, shard.Refs()).ok());
  // The retry sent only what lay past the committed offset (the offset can only have grown).
  auto after = HttpGet(server.metrics_port());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LE(MetricValue(*after, "gradsnap_bytes_in_total") - received,
            static_cast<double>(shard.Payload().size() - qr.committed_size()));
  EXPECT_TRUE(c->Verify("dropped", 3).ok());
  auto got = RestoreToString(c.get(), "dropped", 3, 0);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == shard.Payload());
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
