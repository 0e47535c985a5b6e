// DirectFileWriter: every length (empty, sub-block, block-exact, across staging buffers) comes
// out byte-exact with the exact file size, in $TMPDIR (O_DIRECT on a disk file system) and on
// tmpfs (the buffered fallback where O_DIRECT is refused); misuse after Finish is
// FAILED_PRECONDITION; a missing directory is NOT_FOUND. Where O_DIRECT is refused (at open, or
// by every write: FaultInjectionFileSystem) the same bytes come out through the page cache; a
// write error other than the refusal fails Finish. AppendLent writes lent pieces uncopied where
// the file takes any alignment and releases each of them, errors included.
#include "client/direct_file_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "storage/fault_injection_fs.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace client {
namespace {

// Sets *direct to whether the writer used O_DIRECT there (the file system decides) when it
// was created, *direct_after to whether it still did after the last Append.
// With `hint`, each file is created with expected_bytes = its length + *hint (at least 1).
void RoundTrip(const std::string& dir, bool* direct, bool* direct_after = nullptr,
               storage::FileSystem* fs = storage::FileSystem::Default(),
               std::optional<int64_t> hint = std::nullopt) {
  constexpr size_t kBuf = DirectFileWriter::kBufferBytes;
  for (size_t len : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{100000}, kBuf,
                     kBuf + 1, 2 * kBuf + 12345}) {
    SCOPED_TRACE(len);
    std::string want(len, '\0');
    for (size_t i = 0; i < len; ++i) want[i] = static_cast<char>((i * 131) ^ (i >> 9));
    std::string path = dir + "/f" + std::to_string(len);
    uint64_t expected = 0;
    if (hint) expected = static_cast<uint64_t>(std::max<int64_t>(1, int64_t(len) + *hint));
    auto w = DirectFileWriter::Create(path, fs, expected);
    ASSERT_TRUE(w.ok()) << w.status();
    *direct = (*w)->direct();
    // Appends of uneven sizes, as a restore stream hands them over.
    for (size_t pos = 0, step = 1; pos < len; step = step * 7 + 3) {
      size_t n = std::min(len - pos, step % (3 * kBuf / 2) + 1);
      ASSERT_TRUE((*w)->Append(want.data() + pos, n).ok());
      pos += n;
    }
    ASSERT_TRUE((*w)->Finish().ok());
    if (direct_after != nullptr) {
      *direct_after = (*w)->direct();
    } else {
      EXPECT_EQ((*w)->direct(), *direct);  // no fallback without a refusal
    }
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

// The length given up front (allocated: ext4 here) is a hint: shorter or longer than what is
// written, the file still comes out with exactly the bytes appended.
TEST(DirectFileWriter, ExactBytesWithLengthHint) {
  gradsnap::testing::TempDir dir("dfw");
  for (int64_t hint : {int64_t{0}, int64_t{-1}, int64_t{DirectFileWriter::kBufferBytes}}) {
    SCOPED_TRACE(hint);
    bool direct = false;
    RoundTrip(dir.path(), &direct, nullptr, storage::FileSystem::Default(), hint);
  }
}

TEST(DirectFileWriter, RefusedAtOpenWritesBuffered) {
  gradsnap::testing::TempDir dir("dfw");
  storage::FaultInjectionFileSystem fs;
  storage::FaultInjectionFileSystem::Faults f;
  f.refuse_direct_open = true;
  fs.SetFaults(f);
  bool direct = true;
  RoundTrip(dir.path(), &direct, nullptr, &fs);
  EXPECT_FALSE(direct);
}

TEST(DirectFileWriter, RefusedWritesFallBackToBuffered) {
  gradsnap::testing::TempDir dir("dfw");
  storage::FaultInjectionFileSystem fs;
  storage::FaultInjectionFileSystem::Faults f;
  f.refuse_direct_writes = true;  // every O_DIRECT pwrite: EINVAL
  fs.SetFaults(f);
  bool direct = false, direct_after = true;
  RoundTrip(dir.path(), &direct, &direct_after, &fs);
  // Every length came out exact although each O_DIRECT write was refused, and the writer
  // says it left O_DIRECT (where $TMPDIR took it at open: ext4 here).
  EXPECT_FALSE(direct_after);
  ::testing::Test::RecordProperty("direct_at_open", direct ? "yes" : "no");
}

TEST(DirectFileWriter, OtherWriteErrorsFail) {
  gradsnap::testing::TempDir dir("dfw");
  storage::FaultInjectionFileSystem fs;
  storage::FaultInjectionFileSystem::Faults f;
  f.fail_write_at = 2;  // EIO on the second buffer: no fallback, the error is returned
  f.crash_on_fault = false;
  fs.SetFaults(f);
  auto w = DirectFileWriter::Create(dir.path() + "/f", &fs);
  ASSERT_TRUE(w.ok()) << w.status();
  std::string bytes(3 * DirectFileWriter::kBufferBytes, 'x');
  absl::Status s = (*w)->Append(bytes.data(), bytes.size());
  if (s.ok()) s = (*w)->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;  // EIO
  EXPECT_NE(s.message().find("injected write fault"), std::string::npos) << s;
}

// AppendLent, mixed with Append and with pieces without a hold (copied at once) as an export
// mixes its header and the restored chunks: every length comes out exact, every hold is let go
// by the time Finish returns, and lends() says whether held pieces went uncopied (tmpfs, the
// page cache) or were copied (O_DIRECT on a disk).
void LentRoundTrip(const std::string& dir, storage::FileSystem* fs, bool* lends) {
  constexpr size_t kBuf = DirectFileWriter::kBufferBytes;
  for (size_t len : {size_t{0}, size_t{100}, size_t{4096}, kBuf + 1, 3 * kBuf + 12345}) {
    SCOPED_TRACE(len);
    std::string want(len, '\0');
    for (size_t i = 0; i < len; ++i) want[i] = static_cast<char>((i * 37) ^ (i >> 11));
    const std::string path = dir + "/lent" + std::to_string(len);
    auto w = DirectFileWriter::Create(path, fs, len);
    ASSERT_TRUE(w.ok()) << w.status();
    *lends = (*w)->lends();
    auto released = std::make_shared<std::atomic<int>>(0);
    int lent = 0;
    for (size_t pos = 0, step = 5; pos < len; step = step * 5 + 1, ++lent) {
      size_t n = std::min(len - pos, step % (kBuf / 2) + 1);
      if (lent % 3 == 2) {  // now and then a piece without a hold (copied), or Append
        std::string scratch = want.substr(pos, n);
        if (lent % 2 == 0) {
          ASSERT_TRUE((*w)->AppendLent(scratch.data(), n, nullptr).ok());
        } else {
          ASSERT_TRUE((*w)->Append(scratch.data(), n).ok());
        }
        scratch.assign(n, '\x5a');  // the writer must have copied it
        pos += n;
        continue;
      }
      // Each lent piece lives in memory of its own, whose holder counts its release.
      auto piece = std::shared_ptr<std::string>(new std::string(want.substr(pos, n)),
                                                [released](std::string* p) {
                                                  released->fetch_add(1);
                                                  delete p;
                                                });
      const void* data = piece->data();
      ASSERT_TRUE((*w)->AppendLent(data, n, std::move(piece)).ok());
      pos += n;
    }
    ASSERT_TRUE((*w)->Finish().ok());
    EXPECT_EQ(released->load(), lent - lent / 3);  // every lent piece let go
    EXPECT_EQ((*w)->AppendLent("x", 1, nullptr).code(), absl::StatusCode::kFailedPrecondition);
    w->reset();
    EXPECT_EQ(std::filesystem::file_size(path), len);
    EXPECT_TRUE(gradsnap::testing::ReadFileOrEmpty(path) == want);
  }
}

TEST(DirectFileWriter, LentPiecesExactAndReleased) {
  bool lends = true;
  gradsnap::testing::TempDir disk("dfw");
  LentRoundTrip(disk.path(), storage::FileSystem::Default(), &lends);
  ::testing::Test::RecordProperty("lends_in_tmpdir", lends ? "yes" : "no");
  storage::FaultInjectionFileSystem buffered;  // O_DIRECT refused at open: page cache
  storage::FaultInjectionFileSystem::Faults f;
  f.refuse_direct_open = true;
  buffered.SetFaults(f);
  LentRoundTrip(disk.path(), &buffered, &lends);
  EXPECT_TRUE(lends);
  struct stat st;
  if (::stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm";
  gradsnap::testing::TempDir shm("dfw", "/dev/shm");
  LentRoundTrip(shm.path(), storage::FileSystem::Default(), &lends);
  EXPECT_TRUE(lends);  // tmpfs takes writes of any alignment
}

// A write error while lent pieces wait: returned, and every piece still let go.
TEST(DirectFileWriter, LentWriteErrorReleasesEveryPiece) {
  gradsnap::testing::TempDir dir("dfw");
  storage::FaultInjectionFileSystem fs;
  storage::FaultInjectionFileSystem::Faults f;
  f.refuse_direct_open = true;
  f.fail_write_at = 3;
  f.crash_on_fault = false;
  fs.SetFaults(f);
  auto released = std::make_shared<std::atomic<int>>(0);
  absl::Status s;
  int handed = 0;
  {
    auto w = DirectFileWriter::Create(dir.path() + "/f", &fs);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->lends());
    for (int i = 0; i < 20 && s.ok(); ++i) {
      auto piece = std::shared_ptr<std::string>(new std::string(1 << 20, 'y'),
                                                [released](std::string* p) {
                                                  released->fetch_add(1);
                                                  delete p;
                                                });
      const void* data = piece->data();
      ++handed;
      s = (*w)->AppendLent(data, 1 << 20, std::move(piece));
    }
    if (s.ok()) s = (*w)->Finish();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
  // Every piece handed over was let go once the writer was gone.
  EXPECT_EQ(released->load(), handed);
}

// An exclusive create never opens what is there: a file (left as it was) or a symlink (its
// target untouched), on a disk file system and on tmpfs.
TEST(DirectFileWriter, ExclusiveCreateRefusesAnExistingName) {
  for (const char* base : {"", "/dev/shm"}) {
    struct stat st;
    if (*base != '\0' && ::stat(base, &st) != 0) continue;
    gradsnap::testing::TempDir dir("dfw-excl", base);
    const std::string file = dir.path() + "/taken", target = dir.path() + "/target";
    const std::string link = dir.path() + "/link";
    std::ofstream(file) << "keep";
    std::ofstream(target) << "target";
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
    for (const std::string& path : {file, link}) {
      auto w = DirectFileWriter::Create(path, storage::FileSystem::Default(), 0, true);
      EXPECT_EQ(w.status().code(), absl::StatusCode::kAlreadyExists) << path << w.status();
    }
    EXPECT_EQ(gradsnap::testing::ReadFileOrEmpty(file), "keep");
    EXPECT_EQ(gradsnap::testing::ReadFileOrEmpty(target), "target");
    // A new name is created and written as usual.
    auto w = DirectFileWriter::Create(dir.path() + "/new", storage::FileSystem::Default(), 5, true);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append("hello", 5).ok());
    ASSERT_TRUE((*w)->Finish().ok());
    EXPECT_EQ(gradsnap::testing::ReadFileOrEmpty(dir.path() + "/new"), "hello");
  }
}

TEST(DirectFileWriter, MissingDirectoryIsNotFound) {
  auto w = DirectFileWriter::Create("/nonexistent-gradsnap-dir/x");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
}

}  // namespace
}  // namespace client
}  // namespace gradsnap
