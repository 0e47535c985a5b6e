// Restore directories and export destinations on a bad day: a directory that two restores
// wrote into (another step, or --rank of another one) is refused by --init-from instead of
// resuming a state mixed from two checkpoints; an export never replaces a FIFO or a device node,
// never writes hidden ".rankN" files into a directory named by --out, and checks every file
// name before reading anything; flags that cannot go together are refused.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"
#include "tests/trainer/restore_util.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kCli = GRADSNAP_CLI_BIN;

RunResult Train(const std::string& args) { return TrainTwoRanks(args); }

class RestoreDirTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir("restore_dir");
    // FULLs 5 and 10, DELTAs 6..9 and 11..12: every step from 5 on restores.
    const RunResult r = Train("--steps 12 --ckpt-mode gockpt --ckpt-every 5 --gockpt-window 1 "
                              "--grad-log --job j --ckpt-dir " + Ckpt());
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static std::string Ckpt() { return tmp_->path() + "/ckpt"; }
  static std::string Dir(const std::string& name) { return tmp_->path() + "/" + name; }
  static RunResult Cli(const std::string& args) {
    return RunCommand(absl::StrCat(kCli, " --ckpt-dir ", Ckpt(), " ", args));
  }
  static std::string Step(const std::string& safetensors) {
    return SafetensorsMetadata(safetensors, "step");
  }
  static TempDir* tmp_;
};
TempDir* RestoreDirTest::tmp_ = nullptr;

// Restore step 10, then step 12's rank 1 alone into the same directory: the manifest now names
// step 12 with rank 1 only, and rank0.safetensors is step 10's.
TEST_F(RestoreDirTest, InitFromRefusesRankOfAnotherRestore) {
  const std::string d = Dir("partial");
  ASSERT_EQ(Cli("restore j 10 --out " + d).exit_code, 0);
  ASSERT_EQ(Cli("restore j 12 --rank 1 --out " + d).exit_code, 0);
  ASSERT_EQ(Step(d + "/rank0.safetensors"), "10");
  const RunResult r = Train("--steps 14 --init-from " + d);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "does not list rank 0")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "resumed")) << r.out;
}

// What two restores into one directory at once can leave: a manifest of one step beside a rank
// file of another (made here by copying one rank file across).
TEST_F(RestoreDirTest, InitFromRefusesRankFileOfAnotherStep) {
  const std::string a = Dir("mixed_a"), b = Dir("mixed_b");
  ASSERT_EQ(Cli("restore j 10 --out " + a).exit_code, 0);
  ASSERT_EQ(Cli("restore j 12 --out " + b).exit_code, 0);
  std::filesystem::copy_file(b + "/rank1.safetensors", a + "/rank1.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  const RunResult r = Train("--steps 14 --init-from " + a);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "rank1.safetensors is job 'j' step 12")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "manifest.json says job 'j' step 10")) << r.out;
  // Each directory on its own still resumes.
  const RunResult ok = Train("--steps 14 --init-from " + b);
  ASSERT_TRUE(IsOk(ResumedFrom(ok, 12)));
}

TEST_F(RestoreDirTest, ExportNeverReplacesFifoOrDevice) {
  const std::string fifo = Dir("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const char* step : {"10", "12"}) {  // a raw export, and a replayed one
    const RunResult r = Cli(absl::StrCat("export j ", step, " --rank 0 --out ", fifo));
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "is a device, FIFO or socket")) << r.out;
    struct stat st;
    ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode)) << step;
  }
  if (::geteuid() != 0) GTEST_SKIP() << "mknod of a device node needs root";
  const std::string null = Dir("null");  // a second /dev/null, of this test's own
  ASSERT_EQ(::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  const RunResult r = Cli("export j 10 --out " + Dir("dev") + " --rank 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;  // a plain file is fine
  const RunResult dev = Cli("export j 10 --rank 1 --out " + null);
  EXPECT_EQ(dev.exit_code, 2) << dev.out;
  struct stat st;
  ASSERT_EQ(::lstat(null.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// A multi-rank export names its files after --out; a directory there would have given
// DIR/.rank0 and DIR/.rank1.
TEST_F(RestoreDirTest, ExportToADirectoryNameIsRefused) {
  const std::string d = Dir("outdir");
  std::filesystem::create_directories(d);
  for (const std::string& out : {d, d + "/", d + "/.", d + "/.."}) {
    for (const char* step : {"10", "12"}) {
      const RunResult r = Cli(absl::StrCat("export j ", step, " --out ", out));
      EXPECT_EQ(r.exit_code, 2) << out << ": " << r.out;
      EXPECT_TRUE(absl::StrContains(r.out, "directory")) << r.out;
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(d));
  EXPECT_FALSE(std::filesystem::exists(tmp_->path() + "/.rank0"));
}

// A rank file name taken by a directory is found before anything is read or written: no rank
// file of the set is replaced.
TEST_F(RestoreDirTest, ReplayedExportChecksEveryNameFirst) {
  const std::string base = Dir("set.safetensors");
  ASSERT_EQ(Cli("export j 11 --out " + base).exit_code, 0);
  const std::string rank0 = Dir("set.rank0.safetensors"), rank1 = Dir("set.rank1.safetensors");
  ASSERT_EQ(Step(rank0), "11");
  std::filesystem::remove(rank1);
  std::filesystem::create_directories(rank1);
  const RunResult r = Cli("export j 12 --out " + base);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, rank1 + " is a directory")) << r.out;
  EXPECT_EQ(Step(rank0), "11");
  for (const auto& e : std::filesystem::directory_iterator(tmp_->path())) {
    EXPECT_FALSE(absl::StrContains(e.path().string(), ".tmp-")) << e.path();
  }
}

// A resume continues the checkpoint's optimization exactly and keeps its hyper-parameters;
// flags that say otherwise are named in one line instead of being dropped without a word.
TEST_F(RestoreDirTest, ResumeNamesTheHyperparametersItKeeps) {
  const RunResult r = Train("--steps 13 --resume latest --job j --lr 0.1 --seed 7 --ckpt-dir " +
                            Ckpt());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("resume keeps the checkpoint's hyper-parameters: --lr 0.0006 (this run: "
                       "0.1)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--seed 5 (this run: 7)"), std::string::npos) << r.out;
  const RunResult same = Train("--steps 12 --resume latest --job j --ckpt-dir " + Ckpt());
  ASSERT_EQ(same.exit_code, 0) << same.out;
  EXPECT_EQ(same.out.find("resume keeps"), std::string::npos) << same.out;
}

TEST_F(RestoreDirTest, ConsolidateWithWorldSizeIsRefused) {
  const RunResult r = Cli("restore j latest --consolidate --world-size 5 --out " + Dir("cons"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "drop --world-size")) << r.out;
  EXPECT_FALSE(std::filesystem::exists(Dir("cons")));
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
