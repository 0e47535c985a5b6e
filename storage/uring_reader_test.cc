// UringReader on real files: reads with and without fixed buffers return the file's bytes, a
// read past the end stops at end of file, many reads in flight each get their own bytes, short
// completions (injected at every completion) are read again, and EIO is a clear error.
#include "storage/uring_reader.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "storage/aligned_buffer.h"
#include "storage/fault_injection_fs.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr size_t kFileBytes = 1 << 20;

class UringReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_.set_real_descriptors(true);
    bytes_ = RandomBytes(kFileBytes, 3);
    OpenOptions w;
    w.write = w.create = true;
    auto f = fs_.Open(dir_.path() + "/f", w);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE((*f)->Write(0, bytes_.data(), bytes_.size()).ok());
    ASSERT_TRUE((*f)->Sync().ok());
    OpenOptions r;
    r.direct = true;
    auto rf = fs_.Open(dir_.path() + "/f", r);
    ASSERT_TRUE(rf.ok()) << rf.status();
    file_ = std::move(*rf);
    auto u = UringReader::Create({file_.get()}, {"f"}, 8, 2);
    ASSERT_TRUE(u.ok()) << u.status();
    reader_ = std::move(*u);
  }

  // Reads [offset, offset + n) into buf; the result of `done`.
  absl::StatusOr<size_t> ReadSync(uint64_t offset, uint8_t* buf, size_t n, int slot) {
    absl::Notification done;
    absl::StatusOr<size_t> got;
    reader_->Read(0, offset, buf, n, slot, [&](absl::StatusOr<size_t> g) {
      got = std::move(g);
      done.Notify();
    });
    done.WaitForNotification();
    return got;
  }

  bool Same(const uint8_t* buf, uint64_t offset, size_t n) {
    return std::memcmp(buf, bytes_.data() + offset, n) == 0;
  }

  TempDir dir_;
  FaultInjectionFileSystem fs_;
  std::vector<uint8_t> bytes_;
  std::unique_ptr<File> file_;
  std::unique_ptr<UringReader> reader_;
};

TEST_F(UringReaderTest, PlainAndFixedBuffersReadTheFile) {
  AlignedBuffer plain(256 << 10), fixed(256 << 10);
  auto got = ReadSync(64 << 10, plain.data(), 256 << 10, -1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 256u << 10);
  EXPECT_TRUE(Same(plain.data(), 64 << 10, 256 << 10));
  // Whether the kernel registers it or not (RLIMIT_MEMLOCK), the bytes are the file's.
  bool registered = reader_->RegisterBuffer(1, fixed.data(), fixed.capacity());
  RecordProperty("fixed_buffer_registered", registered ? "yes" : "no");
  got = ReadSync(512 << 10, fixed.data(), 256 << 10, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(Same(fixed.data(), 512 << 10, 256 << 10));
  EXPECT_FALSE(reader_->RegisterBuffer(2, fixed.data(), fixed.capacity()));  // no such slot
}

TEST_F(UringReaderTest, ReadPastTheEndStopsAtEndOfFile) {
  AlignedBuffer buf(256 << 10);
  auto got = ReadSync(kFileBytes - (64 << 10), buf.data(), 256 << 10, -1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 64u << 10);
  EXPECT_TRUE(Same(buf.data(), kFileBytes - (64 << 10), 64 << 10));
}

TEST_F(UringReaderTest, ManyReadsInFlightWithShortCompletions) {
  FaultInjectionFileSystem::Faults f;
  f.short_read_at = -1;
  fs_.SetFaults(f);
  constexpr int kReads = 64;  // more than the queue depth: some wait for a free slot
  constexpr size_t kLen = kFileBytes / kReads;
  AlignedBuffer buf(kFileBytes);
  std::atomic<int> left{kReads}, failed{0};
  absl::Notification all;
  for (int i = 0; i < kReads; ++i) {
    reader_->Read(0, i * kLen, buf.data() + i * kLen, kLen, -1, [&](absl::StatusOr<size_t> g) {
      if (!g.ok() || *g != kLen) failed.fetch_add(1);
      if (left.fetch_sub(1) == 1) all.Notify();
    });
  }
  all.WaitForNotification();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_TRUE(Same(buf.data(), 0, kFileBytes));
  EXPECT_GT(fs_.reads(), 2 * kReads);  // every read came back short at least once
}

TEST_F(UringReaderTest, EioIsAClearError) {
  FaultInjectionFileSystem::Faults f;
  f.fail_read_at = 1;
  fs_.SetFaults(f);
  AlignedBuffer buf(64 << 10);
  auto got = ReadSync(0, buf.data(), 64 << 10, -1);
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("io_uring read f at offset 0"), std::string::npos)
      << got.status();
  // The next read is fine again.
  got = ReadSync(0, buf.data(), 64 << 10, -1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(Same(buf.data(), 0, 64 << 10));
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
