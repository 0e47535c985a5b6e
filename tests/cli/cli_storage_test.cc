// The gradsnap CLI on damaged or unusual engine directories: read-only commands write nothing
// and never create a store, input files are read with a bound, `fsck` reports and `fsck
// --rebuild` restores a lost catalog.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/test_util.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_test_util.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

namespace fs = std::filesystem;

class CliStorageTest : public ::testing::Test {
 protected:
  void SetUp() override { scratch_ = tmp_.path(); }
  RunResult Cli(const std::vector<std::string>& args) {
    return RunProgram(GRADSNAP_CLI_PATH, args);
  }
  // Runs each of `commands` on the store `dir`; every one must exit 0.
  void ExpectAllSucceed(const std::string& dir,
                        const std::vector<std::vector<std::string>>& commands) {
    for (const std::vector<std::string>& cmd : commands) {
      std::vector<std::string> args = {"--ckpt-dir", dir};
      args.insert(args.end(), cmd.begin(), cmd.end());
      RunResult r = Cli(args);
      EXPECT_EQ(r.exit_code, 0) << cmd[0] << ": " << r.err;
    }
  }
  const TempDir tmp_{"cli-storage"};
  std::string scratch_;
};

// Two committed checkpoints of job "j" in an embedded store at `dir`.
void SaveTwo(const std::string& dir) {
  auto c = client::testing::ConnectLocal(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int64_t step : {1, 2}) {
    auto saved = client::testing::SaveTestCheckpoint(**c, "j", step, 2, step, 1 << 20);
    ASSERT_TRUE(saved.ok()) << saved.status();
  }
}

TEST_F(CliStorageTest, LsOfAnEmptyOrMissingDirectoryCreatesNothing) {
  const std::string empty = scratch_ + "/empty";
  fs::create_directories(empty);
  RunResult r = Cli({"--ckpt-dir", empty, "ls"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_TRUE(fs::is_empty(empty)) << "ls created files in " << empty;
  r = Cli({"--ckpt-dir", empty, "verify", "j"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_TRUE(fs::is_empty(empty));
  r = Cli({"--ckpt-dir", scratch_ + "/missing", "ls"});
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_FALSE(fs::exists(scratch_ + "/missing"));
}

TEST_F(CliStorageTest, TokenFileIsReadWithABound) {
  const std::string dir = scratch_ + "/store";
  fs::create_directories(dir);
  RunResult r = Cli({"--ckpt-dir", dir, "--token-file", scratch_, "ls"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "not a regular file")) << r.err;
  r = Cli({"--ckpt-dir", dir, "--token-file", "/dev/zero", "ls"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "not a regular file")) << r.err;
  const std::string big = scratch_ + "/big";
  { std::ofstream(big) << std::string(200 << 10, 'a'); }
  r = Cli({"--ckpt-dir", dir, "--token-file", big, "ls"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "larger than")) << r.err;
  EXPECT_EQ(CountLines(r.err), 1);
}

TEST_F(CliStorageTest, ReadOnlyCommandsChangeNothingAndRunNextToAWriter) {
  const std::string dir = scratch_ + "/store";
  SaveTwo(dir);
  const auto before = DirContents(dir);
  ExpectAllSucceed(dir, {{"ls"},
                         {"ls", "j"},
                         {"show", "j", "2"},
                         {"verify", "j", "--all"},
                         {"restore", "j", "1", "--out", scratch_ + "/out"}});
  EXPECT_TRUE(before == DirContents(dir)) << "a read-only command changed " << dir;
  // A writer holds the store open: reading commands still work.
  auto writer = client::testing::ConnectLocal(dir);
  ASSERT_TRUE(writer.ok()) << writer.status();
  RunResult r = Cli({"--ckpt-dir", dir, "ls", "j"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "2")) << r.out;
  r = Cli({"--ckpt-dir", dir, "verify", "j", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A store on a read-only file system (a tmpfs remounted read-only; skipped where this process
// may not mount): every reading command works, a writing one is one clear line.
TEST_F(CliStorageTest, ReadOnlyFileSystem) {
  const std::string mnt = scratch_ + "/ro";
  Tmpfs tmpfs(mnt);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  const std::string dir = mnt + "/store";
  SaveTwo(dir);
  ASSERT_TRUE(tmpfs.RemountReadOnly().ok());
  ExpectAllSucceed(dir, {{"ls"},
                         {"show", "j", "latest"},
                         {"verify", "j", "--all"},
                         {"restore", "j", "2", "--out", scratch_ + "/out"}});
  RunResult r = Cli({"--ckpt-dir", dir, "rm", "j", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "the file system is read-only")) << r.err;
}

// A store on a full disk (a tmpfs with a ballast file leaving 3 MiB, below the catalog's
// 16 MiB reserve): `health` warns that writes are refused, the reading commands work, and
// `gc` frees space. Before, `gc` and `rm` were refused ("not enough free space to open ...").
TEST_F(CliStorageTest, FullDiskStillReadsAndFreesSpace) {
  const std::string mnt = scratch_ + "/full";
  Tmpfs tmpfs(mnt);
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  const std::string dir = mnt + "/store";
  {
    auto c = client::testing::ConnectLocal(dir);
    ASSERT_TRUE(c.ok()) << c.status();
    for (int64_t step : {1, 2}) {
      auto saved = client::testing::SaveTestCheckpoint(**c, "j", step, 2, step, 8 << 20);
      ASSERT_TRUE(saved.ok()) << saved.status();
    }
  }
  FillUpLeaving(mnt + "/ballast", 3 << 20);
  RunResult r = Cli({"--ckpt-dir", dir, "health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "warning: writes refused: ")) << r.out;
  ExpectAllSucceed(dir, {{"ls"}, {"verify", "j", "--all"},
                         {"restore", "j", "2", "--out", scratch_ + "/out"}});
  r = Cli({"--ckpt-dir", dir, "gc", "j", "--keep-last", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Cli({"--json", "--ckpt-dir", dir, "ls", "j"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(absl::StrContains(r.out, "\"step\":1,")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"step\":2,")) << r.out;
}

TEST_F(CliStorageTest, FsckReportsThenRebuildsALostCatalog) {
  const std::string dir = scratch_ + "/store";
  SaveTwo(dir);
  fs::remove_all(dir + "/meta");
  RunResult r = Cli({"--ckpt-dir", dir, "ls", "j"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--rebuild-catalog")) << r.err;
  const auto before = DirContents(dir);
  r = Cli({"--ckpt-dir", dir, "fsck"});
  // Reported, and not exit 0: the directory is unusable until rebuilt.
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "fsck --rebuild")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "restorable job j step 1 (FULL, 2 shards)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "restorable job j step 2 (FULL, 2 shards)")) << r.out;
  EXPECT_TRUE(before == DirContents(dir)) << "fsck without --rebuild changed " << dir;
  r = Cli({"--ckpt-dir", dir, "fsck", "--rebuild"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "catalog rebuilt: 2 checkpoints")) << r.out;
  r = Cli({"--ckpt-dir", dir, "verify", "j", "--all"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Cli({"--json", "--ckpt-dir", dir, "fsck"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(PythonParsesJson(r.out)) << r.out;
  // gc of a job that has no checkpoint (a typo) is "not found", as for ls or verify.
  r = Cli({"--ckpt-dir", dir, "gc", "nosuchjob", "--keep-last", "1"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
}

TEST_F(CliStorageTest, FsckFindsACheckpointTheSegmentsCannotRestore) {
  const std::string dir = scratch_ + "/store";
  SaveTwo(dir);
  // Flip a byte in the header of the first chunk record of step 1, rank 0 (a record's tail
  // may be padding, its header never is).
  std::string seg = dir + "/segments/j/00000000000000000001/r0000000000-000000.seg";
  ASSERT_TRUE(FlipByte(seg, 20, 0x40).ok());
  RunResult r = Cli({"--ckpt-dir", dir, "fsck"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "LOST       job j step 1")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "restorable job j step 2")) << r.out;
}

// A damaged footer (step 1, rank 0) leaves step 1 restorable through the catalog, though not
// from the footers: `fsck --rebuild` keeps the catalog (nothing changed, exit 3) rather than
// drop step 1; --force rebuilds anyway, keeping the old catalog.
TEST_F(CliStorageTest, RebuildKeepsACatalogThatRestoresMoreThanTheFooters) {
  const std::string dir = scratch_ + "/store";
  SaveTwo(dir);
  std::string seg = dir + "/segments/j/00000000000000000001/r0000000000-000000.seg";
  ASSERT_TRUE(FlipByte(seg, fs::file_size(seg) - 20, 0x40).ok());
  RunResult r = Cli({"--ckpt-dir", dir, "verify", "j", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto before = DirContents(dir);
  r = Cli({"--ckpt-dir", dir, "fsck", "--rebuild"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "catalog not rebuilt")) << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_TRUE(before == DirContents(dir)) << "a refused rebuild changed " << dir;
  r = Cli({"--ckpt-dir", dir, "verify", "j", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = Cli({"--ckpt-dir", dir, "fsck", "--force"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = Cli({"--ckpt-dir", dir, "fsck", "--rebuild", "--force"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "previous catalog kept as")) << r.out;
  r = Cli({"--ckpt-dir", dir, "verify", "j", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
