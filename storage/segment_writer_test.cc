// SegmentWriter on both paths: concurrent appends land at distinct 4 KiB-aligned offsets with
// the right bytes; io_uring is really used where the kernel offers it; errors are sticky.
#include "storage/segment_writer.h"

#include <liburing.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "storage/aligned_buffer.h"
#include "storage/fault_injection_fs.h"
#include "storage/storage_stats.h"
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

// Writes from registered (fixed) buffers: every append of 256 KiB or more from an AlignedBuffer
// goes out as write_fixed; more distinct buffers than slots take turns in the slots; a buffer
// freed and a new one allocated (possibly at the same address) is never written from the old
// registration: the file holds each append's own bytes.
TEST(SegmentWriterTest, FixedBufferWritesCarryTheirOwnBytes) {
  if (!KernelHasIoUring()) GTEST_SKIP() << "no io_uring";
  TempDir dir;
  const std::string path = dir.path() + "/seg";
  auto w = SegmentWriter::Create(FileSystem::Default(), path, SegmentWriterOptions{true, true, 8});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->uses_io_uring());
  const int64_t fixed_before = StorageStats::Get().fixed_buffer_writes->Value();
  constexpr size_t kLen = 2 << 20;  // a mapping of its own (kHugePageBytes): freed, unmapped
  constexpr int kRounds = 40;       // 40 buffers, at most 2 alive at a time: slots are reused
  std::vector<uint8_t> want;
  std::atomic<int> failed{0};
  std::vector<std::unique_ptr<AlignedBuffer>> alive;
  for (int i = 0; i < kRounds; ++i) {
    auto b = std::make_unique<AlignedBuffer>(kLen);
    const auto bytes = RandomBytes(kLen, 100 + i);
    std::memcpy(b->data(), bytes.data(), kLen);
    want.insert(want.end(), bytes.begin(), bytes.end());
    (*w)->Append(b->data(), kLen, [&](const absl::Status& s, uint64_t) {
      if (!s.ok()) failed.fetch_add(1);
    }, b.get());
    ASSERT_TRUE((*w)->Wait().ok());
    alive.push_back(std::move(b));
    if (alive.size() > 2) alive.erase(alive.begin());  // freed: its address may come back
  }
  // A small append from a buffer is a plain write.
  AlignedBuffer small(kIoAlignment);
  std::memset(small.data(), 0x5c, kIoAlignment);
  (*w)->Append(small.data(), kIoAlignment, [&](const absl::Status& s, uint64_t) {
    if (!s.ok()) failed.fetch_add(1);
  }, &small);
  want.insert(want.end(), kIoAlignment, 0x5c);
  ASSERT_TRUE((*w)->Sync().ok());
  EXPECT_EQ(failed.load(), 0);
  const int64_t fixed = StorageStats::Get().fixed_buffer_writes->Value() - fixed_before;
  RecordProperty("fixed_writes", static_cast<int>(fixed));
  EXPECT_EQ(fixed, kRounds);  // root: no memlock limit
  w->reset();
  std::vector<uint8_t> got(want.size());
  FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fread(got.data(), 1, got.size(), f), got.size());
  std::fclose(f);
  EXPECT_TRUE(got == want);
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
