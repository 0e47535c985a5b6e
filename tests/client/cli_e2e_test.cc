// End-to-end tests of the gradsnap CLI: the real build/bin/gradsnap binary run as a subprocess
// against checkpoints written through the client library, on the embedded engine (and, when
// this build has gradsnap-server, against a real server process on 127.0.0.1).
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
#include "tests/client/cli_target.h"
#include "tests/client/cli_test_util.h"

namespace gradsnap {
namespace clitest {
namespace {

using client::testing::SaveTestCheckpoint;
using client::testing::TestCheckpoint;
namespace fs = std::filesystem;

class CliTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    scratch_ = client::testing::MakeTempDir("cli");
    auto target = MakeTarget(GetParam(), scratch_);
    if (!target.ok()) {
      if (absl::IsUnimplemented(target.status())) GTEST_SKIP() << target.status();
      FAIL() << target.status();
    }
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
  void TearDown() override {
    target_.reset();
    client::testing::RemoveDir(scratch_);
  }

  // Runs gradsnap with the target's global flags first, then `args`.
  RunResult Cli(const std::vector<std::string>& args) {
    std::vector<std::string> all = target_->Flags();
    all.insert(all.end(), args.begin(), args.end());
    return RunProgram(GRADSNAP_CLI_PATH, all, scratch_);
  }
  RunResult Python(const std::string& file, const std::string& expected) {
    return RunProgram("python3", {GRADSNAP_SAFETENSORS_READER, file, expected}, scratch_);
  }

  std::string scratch_;
  std::unique_ptr<CliTarget> target_;
  std::map<int64_t, TestCheckpoint> demo_;
  TestCheckpoint solo_;
};

TEST_P(CliTest, LsShowVerify) {
  RunResult r = Cli({"ls"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "demo")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "solo")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "CHECKPOINTS")) << r.out;

  // Global flags after the command work too.
  std::vector<std::string> args = {"ls", "demo"};
  for (const std::string& f : target_->Flags()) args.push_back(f);
  r = RunProgram(GRADSNAP_CLI_PATH, args, scratch_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "STEP")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "committed")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ago")) << r.out;

  r = Cli({"show", "demo", "20"});
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const auto& t : demo_[20].shards[1].tensors) {
    EXPECT_TRUE(absl::StrContains(r.out, t.spec.name)) << t.spec.name << "\n" << r.out;
  }
  EXPECT_TRUE(absl::StrContains(r.out, "bf16")) << r.out;
  r = Cli({"verify", "demo", "10"});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = Cli({"verify", "demo", "--all"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "step 10  ok")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "step 20  ok")) << r.out;
  r = Cli({"health"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.out, "ok")) << r.out;
}

TEST_P(CliTest, RestoreIsByteIdentical) {
  std::string out = scratch_ + "/restored";
  RunResult r = Cli({"restore", "demo", "latest", "--out", out});
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const auto& shard : demo_[20].shards) {
    std::string file = absl::StrCat(out, "/rank", shard.rank, ".safetensors");
    std::string payload;
    ASSERT_TRUE(SafetensorsPayload(file, &payload)) << file;
    EXPECT_TRUE(payload == shard.Payload()) << file << " differs";
    EXPECT_FALSE(fs::exists(file + ".tmp"));
  }
  EXPECT_TRUE(fs::exists(out + "/manifest.json"));
  std::string manifest;
  ASSERT_TRUE(client::testing::ReadFile(out + "/manifest.json", &manifest));
  EXPECT_TRUE(PythonParsesJson(manifest, scratch_));

  std::string one = scratch_ + "/one";
  r = Cli({"restore", "demo", "10", "--out", one, "--rank", "1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(fs::exists(one + "/rank0.safetensors"));
  std::string payload;
  ASSERT_TRUE(SafetensorsPayload(one + "/rank1.safetensors", &payload));
  EXPECT_TRUE(payload == demo_[10].shards[1].Payload());
  r = Cli({"restore", "demo", "10", "--out", one, "--rank", "2"});
  EXPECT_EQ(r.rc, 2) << r.err;
}

TEST_P(CliTest, ExportReadByIndependentPythonReader) {
  std::string file = scratch_ + "/model.safetensors";
  RunResult r = Cli({"export", "demo", "10", "--format", "safetensors", "--out", file});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(fs::exists(file)) << "world size 2 names files per rank";
  for (const auto& shard : demo_[10].shards) {
    std::string f = absl::StrCat(scratch_, "/model.rank", shard.rank, ".safetensors");
    std::string exp = WriteExpectation(shard, "demo", 10,
                                       absl::StrCat(scratch_, "/exp", shard.rank, ".json"));
    RunResult py = Python(f, exp);
    EXPECT_EQ(py.rc, 0) << py.out << py.err;
    EXPECT_TRUE(absl::StartsWith(py.out, "ok ")) << py.out;
  }
  std::string solo = scratch_ + "/solo.safetensors";
  r = Cli({"export", "solo", "5", "--out", solo, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(PythonParsesJson(r.out, scratch_)) << r.out;
  RunResult py = Python(solo, WriteExpectation(solo_.shards[0], "solo", 5, scratch_ + "/e.json"));
  EXPECT_EQ(py.rc, 0) << py.out << py.err;
  // The reader really checks: another step's expectation must fail.
  py = Python(solo, WriteExpectation(demo_[10].shards[0], "solo", 5, scratch_ + "/bad.json"));
  EXPECT_NE(py.rc, 0) << py.out;
  r = Cli({"export", "solo", "5", "--format", "npz", "--out", solo});
  EXPECT_EQ(r.rc, 2);
}

TEST_P(CliTest, RmAndGc) {
  RunResult r = Cli({"rm", "demo", "10"});
  ASSERT_EQ(r.rc, 0) << r.err;
  r = Cli({"show", "demo", "10"});
  EXPECT_EQ(r.rc, 4) << r.out << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: NOT_FOUND")) << r.err;
  std::unique_ptr<client::Client> c = target_->OpenClient();
  ASSERT_NE(c, nullptr);
  for (int64_t step : {30, 40}) ASSERT_TRUE(SaveTestCheckpoint(*c, "demo", step, 2, 1, 0).ok());
  c.reset();
  r = Cli({"gc", "demo", "--keep-last", "2", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(PythonParsesJson(r.out, scratch_)) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"deleted_steps\":[20]")) << r.out;
  r = Cli({"ls", "demo", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
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
    ASSERT_EQ(r.rc, 0) << args[0] << ": " << r.err;
    EXPECT_TRUE(PythonParsesJson(r.out, scratch_)) << args[0] << ": " << r.out;
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
    EXPECT_EQ(r.rc, c.rc) << c.args[0] << " " << (c.args.size() > 1 ? c.args[1] : "") << ": "
                          << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "gradsnap: ")) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  RunResult r = RunProgram(GRADSNAP_CLI_PATH, {"--ckpt-dir", scratch_ + "/none", "ls"}, scratch_);
  EXPECT_EQ(r.rc, 4) << r.err;
  r = Cli({"restore", "--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "--rank R")) << r.out;
  r = RunProgram(GRADSNAP_CLI_PATH, {}, scratch_);
  EXPECT_EQ(r.rc, 2);
}

TEST_P(CliTest, TokenMatchesLibrary) {
  std::string secret_file = scratch_ + "/secret";
  std::ofstream(secret_file) << "0123456789abcdef0123456789abcdef\n";
  RunResult r = RunProgram(GRADSNAP_CLI_PATH, {"token", "demo", "--secret-file", secret_file},
                           scratch_);
  ASSERT_EQ(r.rc, 0) << r.err;
  auto want = MintJobToken("0123456789abcdef0123456789abcdef", "demo");
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(r.out, *want + "\n");
  r = RunProgram(GRADSNAP_CLI_PATH, {"token", "demo", "--secret-file", scratch_ + "/missing"},
                 scratch_);
  EXPECT_NE(r.rc, 0);
}

INSTANTIATE_TEST_SUITE_P(Targets, CliTest, ::testing::ValuesIn(CliTargetNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace clitest
}  // namespace gradsnap
