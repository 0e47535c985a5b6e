// The corpus loader and the deterministic, world-size-independent data order.
#include "trainer/data.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsnap {
namespace trainer {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/data_test_" + std::to_string(getpid()) + "_" + name;
}

TEST(DataTest, DefaultCorpusLoads) {
  auto c = LoadCorpus("", 32);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->tokens.size(), 100000u);
  EXPECT_NE(c->fingerprint.find(':'), std::string::npos);
}

TEST(DataTest, MissingEmptyAndShortFilesAreErrors) {
  EXPECT_TRUE(absl::IsNotFound(LoadCorpus("/nonexistent/file.txt", 8).status()));
  const std::string empty = TempPath("empty");
  { std::ofstream(empty).flush(); }
  auto e = LoadCorpus(empty, 8);
  EXPECT_TRUE(absl::IsInvalidArgument(e.status()));
  EXPECT_NE(e.status().message().find("empty"), std::string::npos);
  const std::string shortf = TempPath("short");
  { std::ofstream(shortf) << "abc"; }
  EXPECT_TRUE(absl::IsInvalidArgument(LoadCorpus(shortf, 8).status()));
  std::remove(empty.c_str());
  std::remove(shortf.c_str());
}

TEST(DataTest, GlobalBatchIsTheSameForEveryWorldSize) {
  auto c = LoadCorpus("", 16);
  ASSERT_TRUE(c.ok());
  const LoaderPosition pos{99, 5};
  DataLoader one(&*c, 16, 4, 0, 1);
  std::vector<int32_t> in1(64), tg1(64);
  one.Batch(pos, in1.data(), tg1.data());
  for (int r = 0; r < 2; ++r) {
    DataLoader half(&*c, 16, 4, r, 2);
    std::vector<int32_t> in(32), tg(32);
    half.Batch(pos, in.data(), tg.data());
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(in[i], in1[r * 32 + i]);
      ASSERT_EQ(tg[i], tg1[r * 32 + i]);
    }
  }
  for (int i = 0; i + 1 < 16; ++i) EXPECT_EQ(tg1[i], in1[i + 1]);  // targets are shifted inputs
  std::vector<int32_t> next(64), nt(64);
  one.Batch(LoaderPosition{99, 6}, next.data(), nt.data());
  EXPECT_NE(next, in1);
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap
