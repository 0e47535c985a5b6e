// End-to-end tests of the gradsnap CLI: the real build/bin/gradsnap binary run as a subprocess
// against checkpoints written through the client library, on the embedded engine and against a
// real gradsnap-server process on 127.0.0.1.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/test_util.h"
#include "common/token.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_target.h"
#include "tests/cli/cli_test_util.h"
#include "tests/testing/server_process.h"

namespace gradsnap {
namespace testing {
namespace {

using client::testing::SaveTestCheckpoint;
using client::testing::TestCheckpoint;
namespace fs = std::filesystem;

class CliTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    scratch_ = tmp_.path();
    auto target = MakeTarget(GetParam(), scratch_);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    std::unique_ptr<client::Client> c = target_->OpenClient();
    ASSERT_NE(c, nullptr);
    for (int64_t step : {10, 20}) {
      auto ck = SaveTestCheckpoint(*c, "demo", step, 2, 42, 256 << 10);
      ASSERT_TRUE(ck.ok()) << ck.status();
      demo_[step] = *std::move(ck);
    }
    auto solo = SaveTestCheckpoint(*c, "solo", 5, 1, 9, 64 << 10);
    ASSERT_TRUE(solo.ok()) << solo.status();
    solo_ = *std::move(solo);
    // c closes here: the embedded engine directory is then free for the CLI process.
  }
  void TearDown() override { target_.reset(); }

  // Runs gradsnap with the target's global flags first, then `args`.
  RunResult Cli(const std::vector<std::string>& args) {
    std::vector<std::string> all = target_->Flags();
    all.insert(all.end(), args.begin(), args.end());
    return RunProgram(GRADSNAP_CLI_PATH, all);
  }
  RunResult Python(const std::string& file, const std::string& expected) {
    return RunProgram("python3", {GRADSNAP_SAFETENSORS_READER, file, expected});
  }

  const TempDir tmp_{"cli"};
  std::string scratch_;
  std::unique_ptr<CliTarget> target_;
  std::map<int64_t, TestCheckpoint> demo_;
  TestCheckpoint solo_;
};

TEST_P(CliTest, LsShowVerify) {
  RunResult r = Cli({"ls"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "demo")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "solo")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "CHECKPOINTS")) << r.out;

  // Global flags after the command work too.
  std::vector<std::string> args = {"ls", "demo"};
  for (const std::string& f : target_->Flags()) args.push_back(f);
  r = RunProgram(GRADSNAP_CLI_PATH, args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "STEP")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "committed")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "just now") || absl::StrContains(r.out, "ago")) << r.out;

  r = Cli({"show", "demo", "20"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& t : demo_[20].shards[1].tensors) {
    EXPECT_TRUE(absl::StrContains(r.out, t.spec.name)) << t.spec.name << "\n" << r.out;
  }
  EXPECT_TRUE(absl::StrContains(r.out, "bf16")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "digest      xxh3-128")) << r.out;  // the default
  r = Cli({"show", "demo", "20", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "\"digest_algorithm\":\"xxh3-128\"")) << r.out;
  r = Cli({"verify", "demo", "10"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Cli({"verify", "demo", "--all"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "step 10  ok")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "step 20  ok")) << r.out;
  r = Cli({"health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.out, "ok")) << r.out;
}

TEST_P(CliTest, RestoreIsByteIdentical) {
  std::string out = scratch_ + "/restored";
  RunResult r = Cli({"restore", "demo", "latest", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& shard : demo_[20].shards) {
    std::string file = absl::StrCat(out, "/rank", shard.rank, ".safetensors");
    std::string payload;
    ASSERT_TRUE(SafetensorsPayload(file, &payload)) << file;
    EXPECT_TRUE(payload == shard.Payload()) << file << " differs";
    EXPECT_FALSE(fs::exists(file + ".tmp"));
  }
  EXPECT_TRUE(fs::exists(out + "/manifest.json"));
  const absl::StatusOr<std::string> manifest = ReadFile(out + "/manifest.json");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(PythonParsesJson(*manifest));

  std::string one = scratch_ + "/one";
  r = Cli({"restore", "demo", "10", "--out", one, "--rank", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(one + "/rank0.safetensors"));
  std::string payload;
  ASSERT_TRUE(SafetensorsPayload(one + "/rank1.safetensors", &payload));
  EXPECT_TRUE(payload == demo_[10].shards[1].Payload());
  r = Cli({"restore", "demo", "10", "--out", one, "--rank", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

TEST_P(CliTest, ExportReadByIndependentPythonReader) {
  std::string file = scratch_ + "/model.safetensors";
  RunResult r = Cli({"export", "demo", "10", "--format", "safetensors", "--out", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(file)) << "world size 2 names files per rank";
  for (const auto& shard : demo_[10].shards) {
    std::string f = absl::StrCat(scratch_, "/model.rank", shard.rank, ".safetensors");
    std::string exp = WriteExpectation(shard, "demo", 10,
                                       absl::StrCat(scratch_, "/exp", shard.rank, ".json"));
    RunResult py = Python(f, exp);
    EXPECT_EQ(py.exit_code, 0) << py.out << py.err;
    EXPECT_TRUE(absl::StartsWith(py.out, "ok ")) << py.out;
  }
  std::string solo = scratch_ + "/solo.safetensors";
  r = Cli({"export", "solo", "5", "--out", solo, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(PythonParsesJson(r.out)) << r.out;
  RunResult py = Python(solo, WriteExpectation(solo_.shards[0], "solo", 5, scratch_ + "/e.json"));
  EXPECT_EQ(py.exit_code, 0) << py.out << py.err;
  // The reader really checks: another step's expectation must fail.
  py = Python(solo, WriteExpectation(demo_[10].shards[0], "solo", 5, scratch_ + "/bad.json"));
  EXPECT_NE(py.exit_code, 0) << py.out;
  r = Cli({"export", "solo", "5", "--format", "npz", "--out", solo});
  EXPECT_EQ(r.exit_code, 2);
}

TEST_P(CliTest, RmAndGc) {
  RunResult r = Cli({"rm", "demo", "10"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Cli({"show", "demo", "10"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: NOT_FOUND")) << r.err;
  std::unique_ptr<client::Client> c = target_->OpenClient();
  ASSERT_NE(c, nullptr);
  for (int64_t step : {30, 40}) ASSERT_TRUE(SaveTestCheckpoint(*c, "demo", step, 2, 1, 0).ok());
  c.reset();
  r = Cli({"gc", "demo", "--keep-last", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(PythonParsesJson(r.out)) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"deleted_steps\":[20]")) << r.out;
  r = Cli({"ls", "demo", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(absl::StrContains(r.out, "\"step\":20,")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"step\":40,")) << r.out;
}

TEST_P(CliTest, JsonOutputsParse) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"ls"}, {"ls", "demo"}, {"show", "demo", "20"},
                                             {"verify", "demo", "--all"}, {"health"}}) {
    std::vector<std::string> a = {"--json"};
    a.insert(a.end(), args.begin(), args.end());
    RunResult r = Cli(a);
    ASSERT_EQ(r.exit_code, 0) << args[0] << ": " << r.err;
    EXPECT_TRUE(PythonParsesJson(r.out)) << args[0] << ": " << r.out;
  }
  RunResult r = Cli({"--json", "ls"});
  EXPECT_TRUE(absl::StrContains(r.out, "{\"job\":\"demo\",\"checkpoints\":2,\"latest_step\":20"))
      << r.out;
}

TEST_P(CliTest, ErrorsAreOneLineWithExitCodes) {
  struct Case {
    std::vector<std::string> args;
    int rc;
  };
  std::vector<Case> cases = {
      {{"frobnicate"}, 2},
      {{"show", "demo"}, 2},
      {{"show", "demo", "ten"}, 2},
      {{"show", "../etc", "1"}, 2},
      {{"show", "a/b", "1"}, 2},
      {{"ls", "--bogus"}, 2},
      {{"restore", "demo", "10"}, 2},
      {{"gc", "demo"}, 2},
      {{"verify", "demo", "10", "--all"}, 2},
      {{"show", "demo", "999"}, 4},
      {{"verify", "nojob"}, 4},
      {{"restore", "nojob", "--out", scratch_ + "/x"}, 4},
  };
  for (const Case& c : cases) {
    RunResult r = Cli(c.args);
    EXPECT_EQ(r.exit_code, c.rc) << c.args[0] << " " << (c.args.size() > 1 ? c.args[1] : "") << ": "
                                 << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: ")) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    if (c.rc == 2) {  // bad input, wherever found, is said as a usage error with the help hint
      EXPECT_FALSE(absl::StrContains(r.err, "INVALID_ARGUMENT")) << r.err;
      EXPECT_TRUE(absl::StrContains(r.err, "--help')")) << r.err;
    }
  }
  RunResult r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", scratch_ + "/none", "ls"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  r = Cli({"restore", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--rank R")) << r.out;
  r = RunProgram(GRADSNAP_CLI_PATH, {});
  EXPECT_EQ(r.exit_code, 2);
}

TEST_P(CliTest, TokenMatchesLibrary) {
  std::string secret_file = scratch_ + "/secret";
  std::ofstream(secret_file) << "0123456789abcdef0123456789abcdef\n";
  RunResult r = RunProgram(GRADSNAP_CLI_PATH, {"token", "demo", "--secret-file", secret_file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto want = MintJobToken("0123456789abcdef0123456789abcdef", "demo");
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(r.out, *want + "\n");
  r = RunProgram(GRADSNAP_CLI_PATH, {"token", "demo", "--secret-file", scratch_ + "/missing"});
  EXPECT_NE(r.exit_code, 0);
}

// A corrupted chunk on disk: verify and restore report DATA_LOSS (exit 3) and write nothing;
// other checkpoints still verify. Embedded only: the test edits the engine's segment files.
// The CLI on the embedded store `dir`.
RunResult CliAt(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), {"--ckpt-dir", dir});
  return RunProgram(GRADSNAP_CLI_PATH, args);
}

TEST(CliCorruptionTest, CorruptChunkFailsVerifyWithDataLoss) {
  const TempDir tmp("cli-corrupt");
  const std::string scratch = tmp.path();
  std::string dir = scratch + "/ckpt";
  {
    auto c = client::testing::ConnectLocal(dir);
    ASSERT_TRUE(c.ok()) << c.status();
    for (int64_t step : {1, 2}) {
      ASSERT_TRUE(SaveTestCheckpoint(**c, "bad", step, 2, 3, 256 << 10).ok());
    }
  }
  int flipped = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir + "/segments/bad")) {
    if (!e.is_regular_file() || !absl::StrContains(e.path().string(), "/00000000000000000002")) {
      continue;
    }
    const uint64_t size = fs::file_size(e.path());
    for (uint64_t off = 100; off < size; off += 4096) {
      ASSERT_TRUE(FlipByte(e.path().string(), off, 0x5a).ok());
      ++flipped;
    }
  }
  ASSERT_GT(flipped, 0) << "no segment files of step 2 under " << dir;
  auto cli = [&](std::vector<std::string> args) { return CliAt(dir, std::move(args)); };
  RunResult r = cli({"verify", "bad", "2"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: DATA_LOSS")) << r.err;
  r = cli({"verify", "bad", "--all", "--json"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(PythonParsesJson(r.out)) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"step\":1,\"ok\":true")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"step\":2,\"ok\":false")) << r.out;
  r = cli({"restore", "bad", "2", "--out", scratch + "/out"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_FALSE(fs::exists(scratch + "/out/rank0.safetensors") &&
               fs::exists(scratch + "/out/rank1.safetensors"));
  EXPECT_FALSE(fs::exists(scratch + "/out/rank0.safetensors.tmp"));
  EXPECT_FALSE(fs::exists(scratch + "/out/manifest.json"));
  r = cli({"verify", "bad", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A scratch directory with an embedded store under it (scratch_/ckpt) and the CLI at it.
class CliStoreTest : public ::testing::Test {
 protected:
  RunResult Cli(std::vector<std::string> args) { return CliAt(dir_, std::move(args)); }
  const TempDir tmp_{"cli-store"};
  const std::string scratch_ = tmp_.path();
  const std::string dir_ = scratch_ + "/ckpt";
};

// Job "two" with FULL steps 1 and 2 of 2 ranks in the embedded store `dir`.
void SaveTwoSteps(const std::string& dir, uint64_t seed) {
  auto c = client::testing::ConnectLocal(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(SaveTestCheckpoint(**c, "two", step, 2, seed, 256 << 10).ok());
  }
}

// Damages every 4 KiB of rank 1's segments of job "two" step 2: rank 0 of it reads fine.
void DamageRank1OfStep2(const std::string& dir) {
  int flipped = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir + "/segments/two")) {
    const std::string p = e.path().string();
    if (!e.is_regular_file() || !absl::StrContains(p, "/00000000000000000002/") ||
        !absl::StartsWith(e.path().filename().string(), "r0000000001-")) {
      continue;
    }
    for (uint64_t off = 100; off < fs::file_size(e.path()); off += 4096) {
      ASSERT_TRUE(FlipByte(p, off, 0x5a).ok());
      ++flipped;
    }
  }
  ASSERT_GT(flipped, 0);
}

// An export of several ranks that fails on one leaves every file of those names as it was (an
// earlier export's), never a set mixing two checkpoints, and no temporary files.
TEST_F(CliStoreTest, FailedExportLeavesEarlierFilesAsTheyWere) {
  SaveTwoSteps(dir_, 5);
  const std::string file = scratch_ + "/model.safetensors";
  RunResult r = Cli({"export", "two", "1", "--out", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string f0 = scratch_ + "/model.rank0.safetensors";
  const std::string f1 = scratch_ + "/model.rank1.safetensors";
  const std::string before0 = ReadFileOrEmpty(f0), before1 = ReadFileOrEmpty(f1);
  ASSERT_FALSE(before0.empty());
  ASSERT_FALSE(before1.empty());
  // Damage rank 1 of step 2 only: rank 0 exports fine, then rank 1 fails.
  DamageRank1OfStep2(dir_);
  r = Cli({"export", "two", "2", "--out", file});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: DATA_LOSS")) << r.err;
  EXPECT_TRUE(ReadFileOrEmpty(f0) == before0) << "rank 0 was replaced by step 2's";
  EXPECT_TRUE(ReadFileOrEmpty(f1) == before1);
  for (const auto& e : fs::directory_iterator(scratch_)) {
    EXPECT_FALSE(absl::StrContains(e.path().filename().string(), ".tmp")) << e.path();
  }
}

// The files under `dir` whose names contain ".tmp-" (unfinished temporaries).
std::vector<std::string> TempFilesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (absl::StrContains(e.path().filename().string(), ".tmp-")) out.push_back(e.path());
  }
  return out;
}

// SIGINT or SIGTERM in the middle of an export ends the CLI at once, as the signal would
// (exit 128 + the signal, one line), and removes the unfinished temporaries it was writing
// (each as large as its rank's file); no output name is made. The server is stopped
// (SIGSTOP) once the first temporary appears, so the export is surely still streaming.
TEST(CliInterruptTest, InterruptedExportRemovesItsTemporaries) {
  const TempDir tmp("cli-interrupt");
  const std::string scratch = tmp.path();
  ServerProcess server(GRADSNAP_SERVER_PATH);
  ASSERT_TRUE(server.StartOn(scratch + "/data").ok()) << server.Describe();
  {
    client::ClientOptions o;
    o.endpoints = {server.address()};
    auto c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(SaveTestCheckpoint(**c, "big", 1, 2, 7, 96u << 20).ok());
  }
  const std::string out_dir = scratch + "/out";
  fs::create_directories(out_dir);
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGTERM");
    ChildProcess cli;
    const std::string log = scratch + "/cli.log";
    ASSERT_TRUE(cli.Start({GRADSNAP_CLI_PATH, "--server", server.address(), "export", "big", "1",
                           "--out", out_dir + "/model.safetensors"},
                          log)
                    .ok());
    bool seen = false;
    for (int i = 0; i < 30000 && !seen && cli.running(); ++i) {  // up to 30 s
      seen = !TempFilesIn(out_dir).empty();
      if (!seen) ::usleep(1000);
    }
    ASSERT_TRUE(seen) << "no temporary appeared; " << ReadFileOrEmpty(log);
    server.Signal(SIGSTOP);
    cli.Signal(sig);
    int code = -1;
    for (int i = 0; i < 1000 && (code = cli.Poll()) < 0; ++i) ::usleep(10000);  // up to 10 s
    server.Signal(SIGCONT);
    if (code < 0) code = cli.Kill();
    EXPECT_EQ(code, 128 + sig) << ReadFileOrEmpty(log);
    const std::string err = ReadFileOrEmpty(log);
    EXPECT_TRUE(absl::StartsWith(err, "gradsnap: interrupted by ")) << err;
    EXPECT_TRUE(absl::StrContains(err, "removed ")) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_TRUE(TempFilesIn(out_dir).empty()) << TempFilesIn(out_dir)[0];
    EXPECT_FALSE(fs::exists(out_dir + "/model.rank0.safetensors"));
    EXPECT_FALSE(fs::exists(out_dir + "/model.rank1.safetensors"));
  }
  // Not interrupted, the same export completes.
  RunResult r = RunProgram(GRADSNAP_CLI_PATH, {"--server", server.address(), "export", "big", "1",
                                               "--out", out_dir + "/model.safetensors"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out_dir + "/model.rank1.safetensors"));
  EXPECT_TRUE(TempFilesIn(out_dir).empty());
}

// A raw restore that fails (damage met in a later rank) leaves an earlier restore in its
// directory as it was, files and manifest.json; a restore of one rank writes a manifest
// vouching for that rank only.
TEST_F(CliStoreTest, FailedRestoreKeepsTheEarlierRestore) {
  SaveTwoSteps(dir_, 7);
  const std::string out = scratch_ + "/out";
  RunResult r = Cli({"restore", "two", "1", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, std::string> before;
  for (const char* f : {"/rank0.safetensors", "/rank1.safetensors", "/manifest.json"}) {
    before[f] = ReadFileOrEmpty(out + f);
    ASSERT_FALSE(before[f].empty()) << f;
  }
  DamageRank1OfStep2(dir_);
  r = Cli({"restore", "two", "2", "--out", scratch_ + "/fresh"});  // a directory of its own
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_FALSE(fs::exists(scratch_ + "/fresh")) << "a failed restore left its directory";
  r = Cli({"restore", "two", "2", "--out", out});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  for (const auto& [f, bytes] : before) {
    EXPECT_TRUE(ReadFileOrEmpty(out + f) == bytes) << f << " changed by a failed restore";
  }
  // One rank: the manifest names that rank only.
  r = Cli({"restore", "two", "1", "--out", out, "--rank", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string manifest = ReadFileOrEmpty(out + "/manifest.json");
  EXPECT_TRUE(absl::StrContains(manifest, "\"rank\":1")) << manifest;
  EXPECT_FALSE(absl::StrContains(manifest, "\"rank\":0")) << manifest;
}

// Commands that would write where there is nothing to write to, or to nowhere, are refused
// before anything is created or read.
TEST(CliCorruptionTest, NoStoreNoPathNoPortAreRefused) {
  const TempDir tmp("cli-refusals");
  const std::string empty = tmp.path() + "/userdir";
  fs::create_directories(empty);
  std::ofstream(empty + "/notes.txt") << "mine";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--ckpt-dir", empty, "gc", "j", "--keep-last", "1"},
        std::vector<std::string>{"--ckpt-dir", empty, "rm", "j", "1"}}) {
    RunResult r = RunProgram(GRADSNAP_CLI_PATH, args);
    EXPECT_EQ(r.exit_code, 4) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "no gradsnap checkpoint store")) << r.err;
  }
  EXPECT_FALSE(fs::exists(empty + "/meta"));
  EXPECT_FALSE(fs::exists(empty + "/segments"));
  RunResult r = RunProgram(GRADSNAP_CLI_PATH, {"--server", "127.0.0.1:99999", "health"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "PORT 1..65535")) << r.err;
  for (const char* cmd : {"export", "restore"}) {
    r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", empty, cmd, "j", "1", "--out", ""});
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
  }
  // A flag taken for the value of the one before it ("--out --json") and a flag after an
  // unknown command: the mistake is named, nothing is created.
  r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", empty, "restore", "j", "1", "--out", "--json"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "needs a value")) << r.err;
  EXPECT_FALSE(fs::exists("--json"));
  r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", empty, "--replicas", "2", "ls"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--server connections only")) << r.err;
  r = RunProgram(GRADSNAP_CLI_PATH, {"badcmd", "--foo"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "unknown command badcmd")) << r.err;
}

// A directory held open by another engine (a trainer) is reported as in use, not as a crash.
TEST(CliLockTest, DirectoryInUseIsOneLineUnavailable) {
  const TempDir tmp("cli-lock");
  const std::string scratch = tmp.path();
  const std::string dir = scratch + "/ckpt";
  auto holder = client::testing::ConnectLocal(dir);
  ASSERT_TRUE(holder.ok()) << holder.status();
  // A writing command needs the directory to itself; reading commands open it read-only and
  // work next to the holder.
  RunResult r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", dir, "rm", "j", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: UNAVAILABLE: checkpoint directory")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "in use")) << r.err;
  r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", dir, "ls"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  holder->reset();
  r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", dir, "ls"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// With --auth-secret-file on the server: the CLI needs the job's token (--token or
// --token-file), and another job's token is refused.
TEST(CliServerAuthTest, TokensFromFlagsAndFiles) {
  const TempDir tmp("cli-auth");
  const std::string scratch = tmp.path();
  std::string secret = scratch + "/secret";
  std::ofstream(secret) << "an-auth-secret-of-32-bytes-long!\n";
  auto target = MakeTarget("server", scratch, {"--auth-secret-file", secret});
  ASSERT_TRUE(target.ok()) << target.status();
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> all = (*target)->Flags();
    all.insert(all.end(), args.begin(), args.end());
    return RunProgram(GRADSNAP_CLI_PATH, all);
  };
  RunResult tok = cli({"token", "demo", "--secret-file", secret});
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  std::string token = tok.out.substr(0, tok.out.find('\n'));
  std::ofstream(scratch + "/demo.token") << token << "\n";
  RunResult other = cli({"token", "other", "--secret-file", secret});
  ASSERT_EQ(other.exit_code, 0) << other.err;
  {
    std::unique_ptr<client::Client> c = (*target)->OpenClient(token);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(SaveTestCheckpoint(*c, "demo", 7, 1, 5, 64 << 10).ok());
  }
  RunResult r = cli({"ls", "demo"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: UNAUTHENTICATED")) << r.err;
  r = cli({"--token", other.out.substr(0, other.out.find('\n')), "show", "demo", "7"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: PERMISSION_DENIED")) << r.err;
  r = cli({"--token-file", scratch + "/demo.token", "verify", "demo", "7"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"show", "demo", "7", "--token", token});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"restore", "demo", "--out", scratch + "/out", "--token", token});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(scratch + "/out/rank0.safetensors"));
  target->reset();
}

// TLS through the CLI's --tls-ca (and mutual TLS with --tls-cert/--tls-key) against a server
// with a certificate from a throwaway CA made with the openssl command.
TEST(CliServerTlsTest, TlsCaAndMutualTls) {
  const TempDir tmp("cli-tls");
  const std::string scratch = tmp.path();
  std::string openssl = absl::StrCat(
      "cd '", scratch, "' && (set -e; "
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=cli-test-ca "
      "-keyout ca.key -out ca.pem; "
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext; "
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr; "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile san.ext -out server.pem; "
      "openssl req -newkey rsa:2048 -nodes -subj /CN=cli -keyout client.key -out client.csr; "
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out client.pem) >openssl.log 2>&1");
  ASSERT_EQ(std::system(openssl.c_str()), 0) << "openssl failed, see " << scratch;
  auto target = MakeTarget("server", scratch,
                           {"--tls-cert", scratch + "/server.pem", "--tls-key",
                            scratch + "/server.key", "--tls-client-ca", scratch + "/ca.pem"});
  ASSERT_TRUE(target.ok()) << target.status();
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> all = (*target)->Flags();
    all.insert(all.end(), args.begin(), args.end());
    return RunProgram(GRADSNAP_CLI_PATH, all);
  };
  const std::vector<std::string> kMutual = {"--tls-ca", scratch + "/ca.pem", "--tls-cert",
                                            scratch + "/client.pem", "--tls-key",
                                            scratch + "/client.key"};
  std::vector<std::string> args = kMutual;
  args.push_back("health");
  RunResult r = cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  args = kMutual;
  args.insert(args.end(), {"ls", "--json"});
  r = cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(PythonParsesJson(r.out)) << r.out;
  // Plaintext against a TLS server, and TLS without the client certificate, both fail.
  r = cli({"health"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: ")) << r.err;
  r = cli({"--tls-ca", scratch + "/ca.pem", "health"});
  EXPECT_NE(r.exit_code, 0) << r.out;
  target->reset();
}

INSTANTIATE_TEST_SUITE_P(Targets, CliTest, ::testing::ValuesIn(CliTargetNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace testing
}  // namespace gradsnap
