// The storage node on an operator's worst day, against real gradsnap-server processes: a lost
// or broken catalog is refused (directory untouched) and rebuilt with --rebuild-catalog, one
// server per port and per data dir, a corrupt durable prefix fails the upload and not the
// server, a full disk is RESOURCE_EXHAUSTED for the writer while reads go on, DELTAs never
// outlive their base over RPC, and a 2 x 20,000-tensor manifest is shown and restored.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/backends.h"
#include "client/client.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "storage/damage_util.h"
#include "storage/engine.h"
#include "storage/fault_injection_fs.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/process.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

namespace fs = std::filesystem;

// Runs gradsnap-server to its exit (killed after 60 s), stdout and stderr captured.
RunResult RunServerToExit(const std::vector<std::string>& args) {
  return RunProgram(GRADSNAP_SERVER_BIN, args, 60);
}

client::CheckpointSpec DeltaSpec(const std::string& job, int64_t step, int64_t base, int32_t w) {
  client::CheckpointSpec s = FullSpec(job, step, w);
  s.kind = client::CheckpointKind::kDelta;
  s.base_step = base;
  return s;
}

// Begins the one-rank FULL of `t` and saves it.
absl::Status SaveFull(client::Client* c, const TestShard& t) {
  absl::Status s = c->BeginCheckpoint(FullSpec(t.spec.job, t.spec.step, 1));
  return s.ok() ? c->SaveShard(t.spec, t.Refs()) : s;
}

TEST(ServiceStorage, SecondServerOnTheSamePortIsRefused) {
  TempDir dir;
  ServerProcess first(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(first.StartOn(dir.File("a")).ok());
  RunResult second = RunServerToExit(
      {"--data-dir", dir.File("b"), "--listen", absl::StrCat("127.0.0.1:", first.port())});
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_TRUE(absl::StrContains(second.err, "gradsnap-server: cannot listen on")) << second.err;
  EXPECT_EQ(second.out, "");
  // The first server still serves.
  auto c = ConnectTo(first.address(), 3);
  EXPECT_TRUE(c->Health().ok());
  EXPECT_EQ(first.Describe(), "running");
}

TEST(ServiceStorage, SecondServerOnTheSameDataDirIsRefused) {
  TempDir dir;
  ServerProcess first(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(first.StartOn(dir.File("data")).ok());
  RunResult second =
      RunServerToExit({"--data-dir", dir.File("data"), "--listen", "127.0.0.1:0"});
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_TRUE(absl::StrContains(second.err, "another process")) << second.err;
  EXPECT_EQ(first.Describe(), "running");
}

// FULL 1 and DELTA 2 (two ranks each) committed; FULL 3 with only rank 0 and rank 1 missing.
struct Written {
  std::vector<TestShard> shards;
};

Written WriteCheckpoints(client::Client* c) {
  Written w;
  EXPECT_TRUE(c->BeginCheckpoint(FullSpec("job", 1, 2)).ok());
  EXPECT_TRUE(c->BeginCheckpoint(DeltaSpec("job", 2, 1, 2)).ok());
  EXPECT_TRUE(c->BeginCheckpoint(FullSpec("job", 3, 2)).ok());
  for (int64_t step : {1, 2}) {
    for (int32_t r = 0; r < 2; ++r) {
      TestShard s = MakeShard("job", step, r, {3 << 20, 1000, 8}, step * 7 + r);
      EXPECT_TRUE(c->SaveShard(s.spec, s.Refs()).ok());
      w.shards.push_back(std::move(s));
    }
  }
  TestShard half = MakeShard("job", 3, 0, {1 << 20}, 99);
  EXPECT_TRUE(c->SaveShard(half.spec, half.Refs()).ok());
  return w;
}

void ExpectRefusedUntouched(const std::string& data_dir, int port) {
  auto before = DirContents(data_dir);
  for (int attempt = 0; attempt < 2; ++attempt) {  // a supervisor restarting it
    RunResult r = RunServerToExit(
        {"--data-dir", data_dir, "--listen", absl::StrCat("127.0.0.1:", port)});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "--rebuild-catalog")) << r.err;
  }
  EXPECT_TRUE(before == DirContents(data_dir)) << "a refused start changed " << data_dir;
}

void RebuildAndExpectBack(const std::string& data_dir, const Written& w) {
  RunResult r = RunServerToExit({"--data-dir", data_dir, "--rebuild-catalog"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "rebuilt job job step 1 (FULL, 2 shards)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "rebuilt job job step 2 (DELTA, 2 shards)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "skipped job job step 3: rank 1 of 2")) << r.out;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(data_dir).ok());
  auto c = ConnectTo(server.address(), 3);
  auto listed = c->List("job", /*include_pending=*/true);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);  // the half-written FULL 3 is not brought back
  EXPECT_EQ((*listed)[1].kind, client::CheckpointKind::kDelta);
  for (const TestShard& s : w.shards) {
    auto got = RestoreToString(c.get(), s.spec.job, s.spec.step, s.spec.rank);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == s.Payload()) << "step " << s.spec.step << " rank " << s.spec.rank;
  }
  EXPECT_TRUE(c->Verify("job", 2).ok());
}

TEST(ServiceStorage, LostCatalogIsRefusedThenRebuilt) {
  TempDir dir;
  const std::string data = dir.File("data");
  Written w;
  int port = 0;
  {
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.StartOn(data).ok());
    port = server.port();
    auto c = ConnectTo(server.address(), 3);
    w = WriteCheckpoints(c.get());
    server.Signal(SIGKILL);
    server.Wait();
  }
  int segments = CountFiles(data + "/segments");
  ASSERT_GT(segments, 0);
  // Removed, emptied, CURRENT deleted: each refused with the directory untouched.
  fs::rename(data + "/meta", dir.File("meta.saved"));
  ExpectRefusedUntouched(data, port);
  fs::create_directories(data + "/meta");
  ExpectRefusedUntouched(data, port);
  fs::remove_all(data + "/meta");
  fs::rename(dir.File("meta.saved"), data + "/meta");
  fs::remove(data + "/meta/CURRENT");
  ExpectRefusedUntouched(data, port);
  EXPECT_EQ(CountFiles(data + "/segments"), segments);
  RebuildAndExpectBack(data, w);
  // Not one segment file deleted: the half-written checkpoint's data is in quarantine.
  EXPECT_EQ(CountFiles(data + "/segments") + CountFiles(data + "/quarantine"), segments);
}

TEST(ServiceStorage, CorruptSstIsRefusedThenRebuilt) {
  TempDir dir;
  const std::string data = dir.File("data");
  Written w;
  int port = 0;
  for (int start = 0; start < 2; ++start) {  // the restart flushes RocksDB's WAL into an SST
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.StartOn(data).ok());
    port = server.port();
    if (start == 0) {
      auto c = ConnectTo(server.address(), 3);
      w = WriteCheckpoints(c.get());
    }
    server.Signal(SIGKILL);
    server.Wait();
  }
  ASSERT_GT(gradsnap::storage::CorruptSstFiles(data + "/meta"), 0);
  const int segments = CountFiles(data + "/segments");
  ExpectRefusedUntouched(data, port);
  RebuildAndExpectBack(data, w);
  EXPECT_EQ(CountFiles(data + "/segments") + CountFiles(data + "/quarantine"), segments);
}

TEST(ServiceStorage, CorruptDurablePrefixFailsTheUploadNotTheServer) {
  TempDir dir;
  const std::string data = dir.File("data");
  TestShard shard = MakeShard("prefix", 1, 0, {12 << 20}, 5);
  {
    storage::EngineOptions eo;
    eo.data_dir = data;
    auto e = storage::Engine::Open(eo);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->BeginCheckpoint(FullSpec("prefix", 1, 1)).ok());
    auto w = (*e)->OpenShardWriter(shard.spec);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(shard.data[0].data(), 6 << 20).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  ASSERT_TRUE(
      FlipByte(data + "/segments/prefix/00000000000000000001/r0000000000-000000.seg", 100, 0x40)
          .ok());
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(data).ok());
  auto c = ConnectTo(server.address(), 3);
  absl::Status s = c->SaveShard(shard.spec, shard.Refs());
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(server.Describe(), "running");
  // Other jobs are written and read.
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("other", 1, 1)).ok());
  TestShard other = MakeShard("other", 1, 0, {1 << 20}, 6);
  ASSERT_TRUE(c->SaveShard(other.spec, other.Refs()).ok());
  auto got = RestoreToString(c.get(), "other", 1, 0);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == other.Payload());
  // The broken upload can be abandoned and redone.
  ASSERT_TRUE(c->AbortCheckpoint("prefix", 1).ok());
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("prefix", 1, 1)).ok());
  EXPECT_TRUE(c->SaveShard(shard.spec, shard.Refs()).ok());
}

TEST(ServiceStorage, OrphanDeltaSequenceAndBaseWithDeltas) {
  TestNode node({"--cache-bytes", "67108864"});
  ASSERT_TRUE(node.status.ok()) << node.status;
  client::Client* c = node.client.get();
  // Begin FULL 10, Begin + Write DELTA 11 (base 10), Abort 10.
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("j", 10, 1)).ok());
  ASSERT_TRUE(c->BeginCheckpoint(DeltaSpec("j", 11, 10, 1)).ok());
  TestShard d = MakeShard("j", 11, 0, {4096}, 1);
  ASSERT_TRUE(c->SaveShard(d.spec, d.Refs()).ok());
  auto listed = c->List("j");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty()) << "a DELTA was listed before its base committed";
  ASSERT_TRUE(c->AbortCheckpoint("j", 10).ok());
  listed = c->List("j", /*include_pending=*/true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty()) << "the DELTA outlived its aborted base";
  // Step 11 again, as a FULL with other bytes: the aborted DELTA's staged copy in the RAM tier
  // is never served for it.
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("j", 11, 1)).ok());
  TestShard again = MakeShard("j", 11, 0, {4096}, 77);
  ASSERT_TRUE(c->SaveShard(again.spec, again.Refs()).ok());
  auto got = RestoreToString(c, "j", 11, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == again.Payload());
  // A committed FULL with a committed DELTA: neither Delete nor Abort takes the FULL.
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("j", 20, 1)).ok());
  TestShard f = MakeShard("j", 20, 0, {4096}, 2);
  ASSERT_TRUE(c->SaveShard(f.spec, f.Refs()).ok());
  ASSERT_TRUE(c->BeginCheckpoint(DeltaSpec("j", 21, 20, 1)).ok());
  TestShard d21 = MakeShard("j", 21, 0, {4096}, 3);
  ASSERT_TRUE(c->SaveShard(d21.spec, d21.Refs()).ok());
  EXPECT_EQ(c->Delete("j", 20).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->AbortCheckpoint("j", 20).code(), absl::StatusCode::kFailedPrecondition);
  listed = c->List("j");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 3u);  // 11 (the FULL), 20, 21
  EXPECT_EQ(node.server.Describe(), "running");
}

// A server in this process on dir/data whose engine uses `fs` and `clock` (null: the real
// ones).
absl::StatusOr<std::unique_ptr<service::Server>> StartInProcess(const TempDir& dir,
                                                                storage::FileSystem* fs,
                                                                Clock* clock) {
  service::ServerOptions o;
  o.engine.data_dir = dir.File("data");
  o.engine.fs = fs;
  o.engine.clock = clock;
  return service::Server::Start(o);
}

TEST(ServiceStorage, FullDiskIsResourceExhaustedForTheWriterAndReadsGoOn) {
  TempDir dir;
  storage::FaultInjectionFileSystem ffs;
  auto server = StartInProcess(dir, &ffs, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = ConnectTo((*server)->address(), 2);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("old", 1, 1)).ok());
  TestShard old = MakeShard("old", 1, 0, {2 << 20}, 1);
  ASSERT_TRUE(c->SaveShard(old.spec, old.Refs()).ok());
  storage::FaultInjectionFileSystem::Faults f;
  f.fail_write_at = 2;
  f.enospc = true;
  f.crash_on_fault = false;
  ffs.Reset();
  ffs.SetFaults(f);
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("new", 1, 1)).ok());
  TestShard fresh = MakeShard("new", 1, 0, {8 << 20}, 2);
  absl::Status s = c->SaveShard(fresh.spec, fresh.Refs());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // Other jobs are written (the failed write was that upload's only) and read.
  EXPECT_TRUE(SaveFull(c.get(), MakeShard("other", 1, 0, {1 << 20}, 3)).ok());
  EXPECT_TRUE(c->Verify("other", 1).ok());
  // Reads keep being served; the old checkpoint verifies.
  EXPECT_TRUE(c->Verify("old", 1).ok());
  auto got = RestoreToString(c.get(), "old", 1, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == old.Payload());
  // Space back: the upload resumes and commits.
  ffs.Reset();
  EXPECT_TRUE(c->SaveShard(fresh.spec, fresh.Refs()).ok());
  EXPECT_TRUE(c->Verify("new", 1).ok());
}

// The server's timestamps come from ServerOptions::engine.clock and travel to the client as is.
TEST(ServiceStorage, TimestampsComeFromTheServersClock) {
  TempDir dir;
  FakeClock clock;
  auto server = StartInProcess(dir, nullptr, &clock);
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = ConnectTo((*server)->address(), 3);
  const int64_t begun = clock.NowUnixMillis();
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("t", 1, 1)).ok());
  clock.AdvanceSeconds(42);
  TestShard s = MakeShard("t", 1, 0, {4096}, 5);
  ASSERT_TRUE(c->SaveShard(s.spec, s.Refs()).ok());
  auto listed = c->List("t");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].created_unix_ms, begun);
  EXPECT_EQ((*listed)[0].committed_unix_ms, begun + 42'000);
}

TEST(ServiceStorage, RealFullFileSystem) {
  TempDir dir;
  Tmpfs tmpfs(dir.File("mnt"));
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  const std::string data = dir.File("mnt") + "/data";
  TestShard fresh = MakeShard("new", 1, 0, {8 << 20}, 2);
  TestShard old = MakeShard("old", 1, 0, {2 << 20}, 1);
  {
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.StartOn(data).ok());
    auto c = ConnectTo(server.address(), 2);
    ASSERT_TRUE(c->BeginCheckpoint(FullSpec("old", 1, 1)).ok());
    ASSERT_TRUE(c->SaveShard(old.spec, old.Refs()).ok());
    FillUp(dir.File("mnt") + "/fill");
    absl::Status s = c->BeginCheckpoint(FullSpec("new", 1, 1));
    if (s.ok()) s = c->SaveShard(fresh.spec, fresh.Refs());
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(server.Describe(), "running");
    EXPECT_TRUE(c->Verify("old", 1).ok());
    auto got = RestoreToString(c.get(), "old", 1, 0);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == old.Payload());
    c.reset();
    EXPECT_EQ(server.Stop(), 0);
  }
  // Restarted on the full disk (0 bytes free: less than even a delete needs; the space the
  // catalog released at its close taken too), the server serves restores with its catalog
  // read-only and says so; rm waits for a restart.
  FillUp(dir.File("mnt") + "/fill2");
  {
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.StartOn(data).ok()) << server.Log();
    EXPECT_TRUE(absl::StrContains(server.ready_line(), "restart once space is freed"))
        << server.ready_line();
    auto c = ConnectTo(server.address(), 1);
    auto got = RestoreToString(c.get(), "old", 1, 0);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == old.Payload());
    EXPECT_EQ(c->Delete("old", 1).code(), absl::StatusCode::kResourceExhausted);
    c.reset();
    EXPECT_EQ(server.Stop(), 0);
  }
  // Read-only opens work on the full file system, and so do read-write ones (refusing writes).
  storage::EngineOptions eo;
  eo.data_dir = data;
  for (bool read_only : {true, false}) {
    eo.read_only = read_only;
    auto e = storage::Engine::Open(eo);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE((*e)->Verify("old", 1).ok());
    EXPECT_EQ((*e)->WriteSpace().restart_needed, !read_only);
  }
  // Space back: the server starts and the upload completes.
  fs::remove(dir.File("mnt") + "/fill");
  fs::remove(dir.File("mnt") + "/fill2");
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(data).ok());
  auto c = ConnectTo(server.address(), 3);
  EXPECT_TRUE(SaveFull(c.get(), fresh).ok());
  EXPECT_TRUE(c->Verify("new", 1).ok());
  c.reset();
  EXPECT_EQ(server.Stop(), 0);
}

// A full storage node restarted (a ballast file left 3 MiB, below the catalog's 16 MiB
// reserve): it starts and says in its ready line, Health and metrics that it refuses writes,
// serves list, restore and verify, answers a save with RESOURCE_EXHAUSTED, frees space through
// rm, and takes the save once space is back, without a restart. Before, it did not start
// ("not enough free space to open ... for writing"): no restore, no rm.
TEST(ServiceStorage, FullNodeServesRestoresFreesSpaceAndTakesWritesAgain) {
  TempDir dir;
  Tmpfs tmpfs(dir.File("mnt"));
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  const std::string data = dir.File("mnt") + "/data";
  const TestShard one = MakeShard("job", 1, 0, {16 << 20}, 1);
  const TestShard two = MakeShard("job", 2, 0, {16 << 20}, 2);
  const TestShard three = MakeShard("job", 3, 0, {1 << 20}, 3);
  {
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.StartOn(data).ok()) << server.Log();
    auto c = ConnectTo(server.address(), 1);
    for (const TestShard* t : {&one, &two}) ASSERT_TRUE(SaveFull(c.get(), *t).ok());
    c.reset();
    ASSERT_EQ(server.Stop(), 0);
  }
  FillUpLeaving(dir.File("mnt") + "/ballast", 3 << 20);
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(data, "127.0.0.1:0", {"--metrics-listen", "127.0.0.1:0"}).ok())
      << server.Log();
  EXPECT_TRUE(absl::StrContains(server.ready_line(),
                                "writes refused: ") &&
              absl::StrContains(server.ready_line(), "below the catalog's reserve of 16777216"))
      << server.ready_line();
  auto refused_gauge = [&]() -> double {
    absl::StatusOr<std::string> body = HttpGet(server.metrics_port());
    return body.ok() ? MetricValue(*body, "gradsnap_storage_write_refused_low_space") : -2;
  };
  EXPECT_EQ(refused_gauge(), 1);
  auto c = ConnectTo(server.address(), 1);
  std::vector<std::string> notes;
  ASSERT_TRUE(c->HealthNotes(&notes).ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(absl::StrContains(notes[0], "writes refused")) << notes[0];
  auto listed = c->List("job");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 2u);
  auto got = RestoreToString(c.get(), "job", 2, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == two.Payload());
  EXPECT_TRUE(c->Verify("job", 1).ok());
  absl::Status s = SaveFull(c.get(), three);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ASSERT_TRUE(c->Delete("job", 1).ok());  // rm: 16 MiB back
  // A moment after: the kernel frees a file read through io_uring when it tears the ring down.
  for (int i = 0; i < 50 && refused_gauge() != 0; ++i) usleep(100 * 1000);
  EXPECT_EQ(refused_gauge(), 0);
  notes.clear();
  ASSERT_TRUE(c->HealthNotes(&notes).ok());
  EXPECT_TRUE(notes.empty());
  EXPECT_TRUE(SaveFull(c.get(), three).ok());
  EXPECT_TRUE(c->Verify("job", 3).ok());
  c.reset();
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServiceStorage, ManifestOf2x20000TensorsIsShownAndRestored) {
  TestNode node({"--zstd-level", "0"});
  ASSERT_TRUE(node.status.ok()) << node.status;
  client::Client* c = node.client.get();
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("wide", 1, 2)).ok());
  std::vector<uint64_t> sizes(20000, 16);
  std::vector<TestShard> shards;
  for (int32_t r = 0; r < 2; ++r) {
    shards.push_back(MakeShard("wide", 1, r, sizes, 40 + r));
    for (size_t i = 0; i < shards.back().spec.tensors.size(); ++i) {
      // Long names make the manifest well over the 4 MiB message limit.
      shards.back().spec.tensors[i].name =
          absl::StrCat("model.layers.", i, ".self_attention.query_key_value.weight.shard_",
                       std::string(40, 'x'));
    }
    std::vector<client::TensorRef> refs = shards.back().Refs();
    for (size_t i = 0; i < refs.size(); ++i) refs[i].spec = shards.back().spec.tensors[i];
    ASSERT_TRUE(c->SaveShard(shards.back().spec, refs).ok());
  }
  auto m = c->Show("wide", 1);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->shards.size(), 2u);
  for (int32_t r = 0; r < 2; ++r) {
    ASSERT_EQ(m->shards[r].tensors.size(), 20000u);
    EXPECT_EQ(m->shards[r].tensors[19999].spec.name, shards[r].spec.tensors[19999].name);
    EXPECT_EQ(m->shards[r].metadata, shards[r].spec.metadata);
    auto got = RestoreToString(c, "wide", 1, r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == shards[r].Payload());
  }
}

// Shards carrying (almost) the largest metadata allowed: a page of the manifest never grows
// past the message limit by taking on the next shard's metadata.
TEST(ServiceStorage, ManifestOfShardsWithLargeMetadataIsShown) {
  TestNode node({"--zstd-level", "0"});
  ASSERT_TRUE(node.status.ok()) << node.status;
  client::Client* c = node.client.get();
  constexpr int kRanks = 4;
  ASSERT_TRUE(c->BeginCheckpoint(FullSpec("meta", 1, kRanks)).ok());
  std::vector<TestShard> shards;
  for (int32_t r = 0; r < kRanks; ++r) {
    shards.push_back(MakeShard("meta", 1, r, std::vector<uint64_t>(200, 16), 60 + r));
    TestShard& sh = shards.back();
    sh.spec.metadata = std::string((1u << 20) - 100, static_cast<char>('a' + r));
    for (size_t i = 0; i < sh.spec.tensors.size(); ++i) {
      sh.spec.tensors[i].name = absl::StrCat("layer.", i, ".", std::string(100, 'n'));
    }
    std::vector<client::TensorRef> refs = sh.Refs();
    for (size_t i = 0; i < refs.size(); ++i) refs[i].spec = sh.spec.tensors[i];
    absl::Status saved = c->SaveShard(sh.spec, refs);
    ASSERT_TRUE(saved.ok()) << saved;
  }
  auto m = c->Show("meta", 1);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->shards.size(), static_cast<size_t>(kRanks));
  for (int32_t r = 0; r < kRanks; ++r) {
    EXPECT_EQ(m->shards[r].metadata, shards[r].spec.metadata) << r;
    EXPECT_EQ(m->shards[r].tensors.size(), 200u);
  }
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
