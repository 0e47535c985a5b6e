// The read path under injected faults, through io_uring (the fault-injecting file system with
// real descriptors, every read completion going through it) and through pread: short reads at
// every io_uring completion still return exact data; EIO at any single read, or at every read,
// is a clear DATA_LOSS error naming the shard (never garbage, never a crash), and a new reader
// reads the shard byte for byte once the fault is gone.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/fault_injection_fs.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr size_t kChunk = 64 << 10;  // many chunks, many reads in flight

class ReadFaultTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ffs_.set_real_descriptors(GetParam());
    EngineOptions o;
    o.data_dir = dir_.path();
    o.fs = &ffs_;
    o.chunk_bytes = kChunk;
    o.use_io_uring = GetParam();
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    CheckpointSpec c;
    c.job = "rf";
    c.step = 1;
    ASSERT_TRUE(engine_->BeginCheckpoint(c).ok());
    ASSERT_TRUE(engine_->WriteShard(data_.spec, data_.ptrs()).ok());
    ffs_.Reset();
  }

  // Reads every tensor with a fresh reader; the first error.
  absl::Status ReadAll() {
    auto r = engine_->OpenShardReader("rf", 1, 0);
    if (!r.ok()) return r.status();
    for (size_t i = 0; i < data_.bytes.size(); ++i) {
      std::vector<uint8_t> out(data_.bytes[i].size());
      absl::Status s = (*r)->ReadTensor(i, out.data(), out.size());
      if (!s.ok()) return s;
      if (out != data_.bytes[i]) return absl::InternalError("different bytes returned as OK");
    }
    return absl::OkStatus();
  }

  // Streams the payload with ReadView; the first error.
  absl::Status ViewAll() {
    auto r = engine_->OpenShardReader("rf", 1, 0);
    if (!r.ok()) return r.status();
    std::vector<uint8_t> got;
    for (;;) {
      const uint8_t* p = nullptr;
      auto n = (*r)->ReadView(got.size(), 100000, &p);
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      got.insert(got.end(), p, p + *n);
    }
    if (got != data_.stream()) return absl::InternalError("different bytes returned as OK");
    return absl::OkStatus();
  }

  TempDir dir_;
  FaultInjectionFileSystem ffs_;
  std::unique_ptr<Engine> engine_;
  const ShardData data_ = MakeShard("rf", 1, 0, 7, 300000);  // ~1.3 MB: ~20 chunks
};

TEST_P(ReadFaultTest, CleanReadCountsEveryRead) {
  ASSERT_TRUE(ReadAll().ok());
  EXPECT_GE(ffs_.reads(), 18);
}

TEST_P(ReadFaultTest, ShortReadAtEveryCompletionReturnsExactData) {
  FaultInjectionFileSystem::Faults f;
  f.short_read_at = -1;
  ffs_.SetFaults(f);
  ExpectRestores(engine_.get(), data_);
  ASSERT_TRUE(ReadAll().ok());
  ASSERT_TRUE(ViewAll().ok());
  if (GetParam()) {
    // Every 64 KiB record needs several completions (halved down to one 4 KiB block): the
    // reader went through the ring and read the rest again each time.
    ffs_.Reset();
    ffs_.SetFaults(f);
    ASSERT_TRUE(ReadAll().ok());
    EXPECT_GT(ffs_.reads(), 3 * 18);
  }
}

TEST_P(ReadFaultTest, EioAtEveryReadIsAClearError) {
  FaultInjectionFileSystem::Faults f;
  f.fail_read_at = -1;
  ffs_.SetFaults(f);
  absl::Status s = ReadAll();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("job rf"), std::string::npos) << s;
  EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s;
  // The streaming path too.
  auto r = engine_->OpenShardReader("rf", 1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<uint8_t> buf(1 << 20);
  auto n = (*r)->Read(0, buf.data(), buf.size());
  EXPECT_TRUE(absl::IsDataLoss(n.status())) << n.status();
  EXPECT_TRUE(absl::IsDataLoss(ViewAll())) << ViewAll();
  ffs_.Reset();
  EXPECT_TRUE(ReadAll().ok());
  EXPECT_TRUE(ViewAll().ok());
}

TEST_P(ReadFaultTest, EioAtEachSingleReadIsAClearError) {
  ASSERT_TRUE(ReadAll().ok());
  const int64_t reads = ffs_.reads();
  for (int64_t at = 1; at <= reads; ++at) {
    SCOPED_TRACE(::testing::Message() << "EIO at read " << at);
    ffs_.Reset();
    FaultInjectionFileSystem::Faults f;
    f.fail_read_at = at;
    ffs_.SetFaults(f);
    absl::Status s = ReadAll();
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s;
  }
  ffs_.Reset();
  ExpectRestores(engine_.get(), data_);
}

INSTANTIATE_TEST_SUITE_P(Paths, ReadFaultTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "IoUring" : "Pread");
                         });

}  // namespace
}  // namespace storage
}  // namespace gradsnap
