// UringReader on real files: reads with and without fixed buffers return the file's bytes, a
// read past the end stops at end of file, many reads in flight each get their own bytes, short
// completions (injected at every completion) are read again, and EIO is a clear error. Where
// the kernel refuses io_uring (a seccomp filter, as Docker's default profile has), Create is an
// error, not a crash, and an engine reads with pread; a refused submit fails its reads, and
// nothing it left in the submission queue ever runs.
#include "storage/uring_reader.h"

#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
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

// Each case runs in a child process (a seccomp filter cannot be lifted); it exits 0 when all
// its checks hold, else 1 with the failure on stderr.
#define CHILD_CHECK(cond)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #cond); \
      std::fflush(stderr);                                                  \
      _exit(1);                                                             \
    }                                                                       \
  } while (0)

// Runs `body` (its checks CHILD_CHECKs) in such a child and expects it to exit 0.
void ExpectChildPasses(const std::function<void()>& body) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [&] {
    body();
    _exit(0);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

TEST_F(UringReaderTest, RingRefusedByTheKernelIsAnErrorNotACrash) {
  ExpectChildPasses([&] {
    CHILD_CHECK(DenySyscall(__NR_io_uring_setup));
    auto u = UringReader::Create({file_.get()}, {"f"}, 8, 2);
    CHILD_CHECK(!u.ok());
    CHILD_CHECK(absl::IsPermissionDenied(u.status()));
  });
}

TEST_F(UringReaderTest, RefusedSubmitFailsTheReadAndItsQueuedEntryNeverRuns) {
  ExpectChildPasses([&] {
    // The reader is destroyed on a thread started before the filter (so it may submit):
    // a destructor that submitted would hand the kernel the refused read's queued entry,
    // a read into a buffer its request no longer owns.
    absl::Notification destroy, destroyed;
    std::thread destroyer([&] {
      destroy.WaitForNotification();
      reader_.reset();
      destroyed.Notify();
    });
    CHILD_CHECK(DenySyscall(__NR_io_uring_enter));  // this thread's submits are refused
    AlignedBuffer buf(64 << 10);
    std::memset(buf.data(), 0xAA, buf.capacity());
    auto got = ReadSync(0, buf.data(), 64 << 10, -1);
    CHILD_CHECK(absl::IsPermissionDenied(got.status()));
    got = ReadSync(0, buf.data(), 64 << 10, -1);  // the ring stays refused
    CHILD_CHECK(!got.ok());
    destroy.Notify();
    destroyed.WaitForNotification();  // returns: the reaper stopped without a NOP
    destroyer.join();
    usleep(100 * 1000);
    for (size_t i = 0; i < buf.capacity(); ++i) CHILD_CHECK(buf.data()[i] == 0xAA);
  });
}

// In a death test's child: an engine in `dir` with checkpoint (job, 1) begun.
std::unique_ptr<Engine> OpenWithCheckpoint(const TempDir& dir, const std::string& job) {
  EngineOptions o;
  o.data_dir = dir.path() + "/e";
  auto e = Engine::Open(o);
  CHILD_CHECK(e.ok());
  CheckpointSpec cs{job, 1, CheckpointKind::kFull, -1, 1, ""};
  CHILD_CHECK((*e)->BeginCheckpoint(cs).ok());
  return *std::move(e);
}

// In a death test's child: writes `d`, verifies it and streams it back, byte for byte.
void WriteVerifyAndStreamBack(Engine* e, const ShardData& d) {
  CHILD_CHECK(e->WriteShard(d.spec, d.ptrs()).ok());
  CHILD_CHECK(e->Verify(d.spec.job, 1).ok());
  auto r = e->OpenShardReader(d.spec.job, 1, 0);
  CHILD_CHECK(r.ok());
  const std::vector<uint8_t> want = d.stream();
  std::vector<uint8_t> got(want.size());
  for (uint64_t pos = 0; pos < got.size();) {
    auto n = (*r)->Read(pos, got.data() + pos, got.size() - pos);
    CHILD_CHECK(n.ok() && *n > 0);
    pos += *n;
  }
  CHILD_CHECK(got == want);
}

// As in a container whose seccomp profile refuses io_uring: the engine writes and reads with
// pread/pwrite, every byte as written.
TEST(UringRefusedEngineTest, EngineWritesAndRestoresWithoutIoUring) {
  TempDir dir;
  ExpectChildPasses([&] {
    CHILD_CHECK(DenySyscall(__NR_io_uring_setup));
    auto e = OpenWithCheckpoint(dir, "nouring");
    WriteVerifyAndStreamBack(e.get(), MakeShard("nouring", 1, 0, 9));
  });
}

// A read the machine refuses (here io_uring_enter, as a seccomp profile added later might) is
// that error, not DATA_LOSS: a restore must not take a sound checkpoint for a damaged one.
TEST(UringRefusedEngineTest, RefusedReadIsNotDataLoss) {
  TempDir dir;
  ExpectChildPasses([&] {
    auto e = OpenWithCheckpoint(dir, "refused");
    ShardData d = MakeShard("refused", 1, 0, 9);
    CHILD_CHECK(e->WriteShard(d.spec, d.ptrs()).ok());
    CHILD_CHECK(DenySyscall(__NR_io_uring_enter));
    auto r = e->OpenShardReader("refused", 1, 0);
    CHILD_CHECK(r.ok());
    std::vector<uint8_t> got(d.stream().size());
    auto n = (*r)->Read(0, got.data(), got.size());
    CHILD_CHECK(absl::IsPermissionDenied(n.status()));
    CHILD_CHECK(n.status().message().find("job refused step 1 rank 0") != std::string::npos);
  });
}

// Out of threads (a pids cgroup, RLIMIT_NPROC; here clone refused with EAGAIN): the writer's
// encoder pool and ring thread, the reader's reaper and decode pool cannot start. The engine
// writes and reads on the caller's thread instead of aborting the process.
TEST(ThreadsRefusedEngineTest, EngineWritesAndRestoresWithoutNewThreads) {
  TempDir dir;
  ExpectChildPasses([&] {
    auto e = OpenWithCheckpoint(dir, "nothreads");
    CHILD_CHECK(DenySyscall(__NR_clone, EAGAIN));
    CHILD_CHECK(DenySyscall(__NR_clone3, EAGAIN));
    WriteVerifyAndStreamBack(e.get(), MakeShard("nothreads", 1, 0, 11, 3000000));  // 12 MB
  });
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
