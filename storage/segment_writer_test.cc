// SegmentWriter on both paths: concurrent appends land at distinct 4 KiB-aligned offsets with
// the right bytes; io_uring is really used where the kernel offers it; errors are sticky.
#include "storage/segment_writer.h"

#include <liburing.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "storage/aligned_buffer.h"
#include "storage/fault_injection_fs.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

bool KernelHasIoUring() {
  io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) < 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}

void AppendConcurrently(bool uring, FileSystem* fs) {
  TempDir dir;
  std::string path = dir.path() + "/seg";
  auto w = SegmentWriter::Create(fs, path, SegmentWriterOptions{uring, true, 16});
  ASSERT_TRUE(w.ok()) << w.status();
  if (uring && fs == FileSystem::Default() && KernelHasIoUring()) {
    EXPECT_TRUE((*w)->uses_io_uring());
  }
  constexpr int kThreads = 4, kPerThread = 40;
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    size_t len = kIoAlignment * (1 + i % 7);
    bufs.emplace_back(len);
    auto bytes = RandomBytes(len, i);
    std::memcpy(bufs.back().data(), bytes.data(), len);
  }
  std::vector<uint64_t> offsets(bufs.size());
  std::atomic<int> done{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        int i = t * kPerThread + k;
        (*w)->Append(bufs[i].data(), bufs[i].capacity(),
                     [&, i](const absl::Status& s, uint64_t off) {
                       offsets[i] = off;
                       (s.ok() ? done : failed).fetch_add(1);
                     });
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE((*w)->Sync().ok());
  EXPECT_EQ(done.load(), kThreads * kPerThread);
  EXPECT_EQ(failed.load(), 0);
  uint64_t end = (*w)->end();
  w->reset();
  auto f = FileSystem::Default()->Open(path, OpenOptions{});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*(*f)->Size(), end);
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(offsets[i] % kIoAlignment, 0u);
    std::vector<uint8_t> got(bufs[i].capacity());
    ASSERT_EQ(*(*f)->Read(offsets[i], got.data(), got.size()), got.size());
    ASSERT_EQ(0, std::memcmp(got.data(), bufs[i].data(), got.size())) << "buffer " << i;
  }
}

TEST(SegmentWriterTest, IoUringConcurrentAppends) { AppendConcurrently(true, FileSystem::Default()); }
TEST(SegmentWriterTest, PwriteConcurrentAppends) { AppendConcurrently(false, FileSystem::Default()); }
TEST(SegmentWriterTest, FaultFileSystemUsesPwrite) {
  FaultInjectionFileSystem fs;
  AppendConcurrently(true, &fs);
}

TEST(SegmentWriterTest, ErrorsAreStickyAndEveryCallbackRuns) {
  FaultInjectionFileSystem fs;
  TempDir dir;
  auto w = SegmentWriter::Create(&fs, dir.path() + "/seg", SegmentWriterOptions{});
  ASSERT_TRUE(w.ok());
  FaultInjectionFileSystem::Faults f;
  f.fail_write_at = 2;
  f.enospc = true;
  f.crash_on_fault = false;
  fs.SetFaults(f);
  AlignedBuffer buf(kIoAlignment);
  std::memset(buf.data(), 1, kIoAlignment);
  int ok = 0, bad = 0;
  for (int i = 0; i < 5; ++i) {
    (*w)->Append(buf.data(), kIoAlignment,
                 [&](const absl::Status& s, uint64_t) { (s.ok() ? ok : bad)++; });
  }
  absl::Status s = (*w)->Sync();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(bad, 4);
  (*w)->Append(buf.data(), 100, [&](const absl::Status& st, uint64_t) {
    EXPECT_FALSE(st.ok());
  });
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
