// AlignedBuffer: small buffers are 4 KiB aligned; buffers of kHugePageBytes or more start on a
// 2 MiB boundary, every byte of their capacity is usable, they move without copying, and their
// whole 2 MiB pages carry the MADV_HUGEPAGE advice (VmFlags "hg" in /proc/self/smaps) where the
// kernel has transparent huge pages. Prefault makes every page resident. BufferPool hands a
// returned buffer out again.
#include "storage/aligned_buffer.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradsnap {
namespace storage {
namespace {

uintptr_t Addr(const AlignedBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); }

// The line starting with `key` of the mapping that starts at `start` in /proc/self/smaps;
// "" when no mapping starts there.
std::string SmapsLineAt(uintptr_t start, const std::string& key) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      in = lo == start;
      continue;
    }
    if (in && line.rfind(key, 0) == 0) return line;
  }
  return "";
}

std::string VmFlagsAt(uintptr_t start) { return SmapsLineAt(start, "VmFlags:"); }

// Resident kB of the mapping that starts at `start`; -1 when no mapping starts there.
long RssKbAt(uintptr_t start) {
  long kb = -1;
  if (std::sscanf(SmapsLineAt(start, "Rss:").c_str(), "Rss: %ld kB", &kb) != 1) return -1;
  return kb;
}

TEST(AlignedBufferTest, SmallBufferIsPageAligned) {
  AlignedBuffer b(100);
  EXPECT_EQ(b.capacity(), kIoAlignment);
  EXPECT_EQ(Addr(b) % kIoAlignment, 0u);
  std::memset(b.data(), 7, b.capacity());
  EXPECT_EQ(b.data()[b.capacity() - 1], 7);
}

TEST(AlignedBufferTest, LargeBufferStartsOnHugePageAndIsWholeUsable) {
  const size_t want = 5 * (1 << 20) + 100;
  AlignedBuffer b(want);
  EXPECT_EQ(b.capacity(), AlignUp(want));
  EXPECT_EQ(Addr(b) % kHugePageBytes, 0u);
  for (size_t i = 0; i < b.capacity(); i += 997) b.data()[i] = static_cast<uint8_t>(i);
  for (size_t i = 0; i < b.capacity(); i += 997) {
    ASSERT_EQ(b.data()[i], static_cast<uint8_t>(i)) << i;
  }
  uint8_t* p = b.data();
  AlignedBuffer moved(std::move(b));
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.capacity(), 0u);
  AlignedBuffer assigned(64);
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), p);
  EXPECT_EQ(assigned.capacity(), AlignUp(want));
}

TEST(AlignedBufferTest, LargeBufferAdvisesHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    GTEST_SKIP() << "kernel without transparent huge pages";
  }
  AlignedBuffer b(4 * kHugePageBytes + kIoAlignment);
  const std::string flags = VmFlagsAt(Addr(b));
  ASSERT_FALSE(flags.empty()) << "no mapping starts at the buffer";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

TEST(AlignedBufferTest, PrefaultMapsEveryPage) {
  AlignedBuffer b(2 * kHugePageBytes);  // a mapping of its own
  ASSERT_EQ(RssKbAt(Addr(b)), 0) << "a fresh mapping is not resident";
  b.Prefault();
  EXPECT_EQ(RssKbAt(Addr(b)), static_cast<long>(b.capacity() / 1024));
  b.data()[b.capacity() - 1] = 9;
  b.Prefault();  // a mapped buffer stays usable
  EXPECT_EQ(b.data()[0], 0);
}

TEST(BufferPoolTest, ReusesReturnedBuffers) {
  BufferPool pool(3 << 20, 2);
  auto a = pool.Get();
  ASSERT_EQ(a->capacity(), size_t{3} << 20);
  uint8_t* p = a->data();
  pool.Put(std::move(a));
  auto again = pool.Get();
  EXPECT_EQ(again->data(), p);
  pool.Put(std::make_unique<AlignedBuffer>(4096));  // another capacity: dropped
  auto fresh = pool.Get();
  EXPECT_EQ(fresh->capacity(), size_t{3} << 20);
}

TEST(BufferPoolTest, GetFaultedTakesPooledBuffersFirstAndMapsEveryOne) {
  BufferPool pool(2 * kHugePageBytes, 4);
  auto pooled = pool.Get();
  uint8_t* p = pooled->data();
  pool.Put(std::move(pooled));
  std::vector<std::unique_ptr<AlignedBuffer>> bufs = pool.GetFaulted(3);
  ASSERT_EQ(bufs.size(), 3u);
  EXPECT_EQ(bufs[0]->data(), p);  // the pooled one, then two new ones
  EXPECT_EQ(pool.cached(), 0u);
  for (const auto& b : bufs) {
    EXPECT_EQ(b->capacity(), 2 * kHugePageBytes);
    EXPECT_EQ(RssKbAt(Addr(*b)), static_cast<long>(b->capacity() / 1024));
  }
}

TEST(BufferPoolTest, ReservationKeepsItsBuffersFromOtherCallers) {
  BufferPool pool(4096, 2);
  auto cached = pool.Get();
  uint8_t* c = cached->data();
  pool.Put(std::move(cached));
  BufferPool::Reservation r(&pool);
  r.Reserve(2);  // the cached buffer and a new one, set aside in the pool
  EXPECT_EQ(r.kept(), 2u);
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(pool.TryGet(), nullptr);  // another caller finds none
  auto other = pool.Get();            // and gets a new one
  EXPECT_NE(other->data(), c);
  std::vector<std::unique_ptr<AlignedBuffer>> mine;
  for (int i = 0; i < 3; ++i) mine.push_back(r.Get());  // the two reserved, then a new one
  EXPECT_EQ(r.kept(), 0u);
  EXPECT_TRUE(mine[0]->data() == c || mine[1]->data() == c);
  for (auto& b : mine) r.Put(std::move(b));  // two set aside again, the third to the pool
  EXPECT_EQ(r.kept(), 2u);
  EXPECT_EQ(pool.cached(), 1u);
  pool.Put(std::move(other));
  EXPECT_EQ(pool.cached(), 2u);
  r.Release();  // the pool keeps max_cached (2): the two set aside are freed
  EXPECT_EQ(r.kept(), 0u);
  EXPECT_EQ(pool.cached(), 2u);
  r.Put(pool.Get());  // released: a buffer put goes to the pool
  EXPECT_EQ(r.kept(), 0u);
  EXPECT_EQ(pool.cached(), 2u);
}

TEST(BufferPoolTest, ReservationEndsWithItsOwner) {
  BufferPool pool(4096, 4);
  {
    BufferPool::Reservation r(&pool);
    r.Reserve(3);
    auto b = r.Get();  // freed by its holder, after the reservation ends
    EXPECT_EQ(pool.cached(), 0u);
  }  // the two kept go back to the pool with the reservation
  EXPECT_EQ(pool.cached(), 2u);
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
