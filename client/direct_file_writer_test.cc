// DirectFileWriter: every length (empty, sub-block, block-exact, across staging buffers) comes
// out byte-exact with the exact file size, in $TMPDIR (O_DIRECT on a disk file system) and on
// tmpfs (the buffered fallback where O_DIRECT is refused); misuse after Finish is
// FAILED_PRECONDITION; a missing directory is NOT_FOUND.
#include "client/direct_file_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace client {
namespace {

// Sets *direct to whether the writer used O_DIRECT there (the file system decides).
void RoundTrip(const std::string& dir, bool* direct) {
  constexpr size_t kBuf = DirectFileWriter::kBufferBytes;
  for (size_t len : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{100000}, kBuf,
                     kBuf + 1, 2 * kBuf + 12345}) {
    SCOPED_TRACE(len);
    std::string want(len, '\0');
    for (size_t i = 0; i < len; ++i) want[i] = static_cast<char>((i * 131) ^ (i >> 9));
    std::string path = dir + "/f" + std::to_string(len);
    auto w = DirectFileWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    *direct = (*w)->direct();
    // Appends of uneven sizes, as a restore stream hands them over.
    for (size_t pos = 0, step = 1; pos < len; step = step * 7 + 3) {
      size_t n = std::min(len - pos, step % (3 * kBuf / 2) + 1);
      ASSERT_TRUE((*w)->Append(want.data() + pos, n).ok());
      pos += n;
    }
    ASSERT_TRUE((*w)->Finish().ok());
    EXPECT_EQ((*w)->Append("x", 1).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*w)->Finish().code(), absl::StatusCode::kFailedPrecondition);
    w->reset();
    EXPECT_EQ(std::filesystem::file_size(path), len);
    EXPECT_TRUE(gradsnap::testing::ReadFileOrEmpty(path) == want);
  }
}

TEST(DirectFileWriter, ExactBytesInTmpdir) {
  gradsnap::testing::TempDir dir("dfw");
  // A disk-backed $TMPDIR takes O_DIRECT (ext4, xfs, btrfs); tmpfs takes the fallback.
  bool direct = false;
  RoundTrip(dir.path(), &direct);
  ::testing::Test::RecordProperty("direct", direct ? "yes" : "no");
}

TEST(DirectFileWriter, ExactBytesOnTmpfs) {
  struct stat st;
  if (::stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm";
  gradsnap::testing::TempDir dir("dfw", "/dev/shm");
  bool direct = false;
  RoundTrip(dir.path(), &direct);
}

TEST(DirectFileWriter, MissingDirectoryIsNotFound) {
  auto w = DirectFileWriter::Create("/nonexistent-gradsnap-dir/x");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
}

}  // namespace
}  // namespace client
}  // namespace gradsnap
