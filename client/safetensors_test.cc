// ExportShardSafetensors through the embedded client: the file is the header and then exactly
// the bytes a restore returns, tensor by tensor (on a disk file system, O_DIRECT, and on tmpfs),
// across several of the file writer's buffers; a corrupt chunk met halfway is DATA_LOSS and
// leaves nothing at the destination name (an older file there stays as it was) and no temporary
// file; two exports to one path at once each write a temporary of their own and leave a whole
// file; a directory as the destination is refused before anything is read.
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/direct_file_writer.h"
#include "client/safetensors.h"
#include "client/test_util.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace client {
namespace {

namespace fs = std::filesystem;

// Temporary files (storage::UniqueTempPath: NAME.tmp-PID-N) left in `dir`.
int TempFilesIn(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    n += e.path().filename().string().find(".tmp-") != std::string::npos ? 1 : 0;
  }
  return n;
}

// Larger than two of the file writer's buffers, so the export writes while it restores.
constexpr uint64_t kBigBytes = 2 * DirectFileWriter::kBufferBytes + (3u << 20) + 4;

class SafetensorsExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = testing::ConnectLocal(store_.path() + "/ckpt");
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    auto saved = testing::SaveTestCheckpoint(*client_, "job", 7, 1, 11, kBigBytes);
    ASSERT_TRUE(saved.ok()) << saved.status();
    auto m = client_->Show("job", 7);
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }

  // The header, then every tensor as RestoreTensor returns it, in manifest order.
  std::string Expected() {
    const ShardInfo& shard = manifest_.shards.at(0);
    auto header = SafetensorsHeader(manifest_.info, shard);
    EXPECT_TRUE(header.ok()) << header.status();
    std::string want = header.ok() ? *header : "";
    for (const storage::TensorInfo& t : shard.tensors) {
      std::string buf(t.spec.byte_length, '\xee');
      absl::Status s = client_->RestoreTensor("job", 7, 0, t.spec.name, buf.data(), buf.size());
      EXPECT_TRUE(s.ok()) << t.spec.name << ": " << s;
      want += buf;
    }
    return want;
  }

  void ExpectByteExactExport(const std::string& dir) {
    const std::string path = dir + "/out.safetensors";
    ASSERT_TRUE(ExportShardSafetensors(*client_, manifest_, 0, path).ok());
    std::string got = gradsnap::testing::ReadFileOrEmpty(path);
    std::string want = Expected();
    EXPECT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want) << "exported file differs from header + restored tensors";
    EXPECT_EQ(TempFilesIn(dir), 0);
  }

  gradsnap::testing::TempDir store_{"st-export"};
  std::unique_ptr<Client> client_;
  Manifest manifest_;
};

TEST_F(SafetensorsExportTest, ByteExactOnDisk) { ExpectByteExactExport(store_.path()); }

TEST_F(SafetensorsExportTest, ByteExactOnTmpfs) {
  struct stat st;
  if (::stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm";
  gradsnap::testing::TempDir shm("st-export", "/dev/shm");
  ExpectByteExactExport(shm.path());
}

TEST_F(SafetensorsExportTest, CorruptChunkIsDataLossAndLeavesNoFile) {
  const std::string fresh = store_.path() + "/fresh.safetensors";
  const std::string older = store_.path() + "/older.safetensors";
  ASSERT_TRUE(ExportShardSafetensors(*client_, manifest_, 0, older).ok());
  const std::string before = gradsnap::testing::ReadFileOrEmpty(older);
  client_.reset();  // the engine closed while its segment is damaged
  // The middle byte of the segment: a chunk of the big tensor, past the first file buffer.
  ASSERT_EQ(gradsnap::testing::FlipSegmentBytes(store_.path() + "/ckpt", "job", 7, 0), 1);
  auto c = testing::ConnectLocal(store_.path() + "/ckpt");
  ASSERT_TRUE(c.ok()) << c.status();
  for (const std::string& path : {fresh, older}) {
    absl::Status s = ExportShardSafetensors(**c, manifest_, 0, path);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
  EXPECT_EQ(TempFilesIn(store_.path()), 0);
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_TRUE(gradsnap::testing::ReadFileOrEmpty(older) == before) << "older export changed";
}

TEST_F(SafetensorsExportTest, ConcurrentExportsToOnePathEachLeaveAWholeFile) {
  const std::string path = store_.path() + "/same.safetensors";
  const std::string want = Expected();
  for (int round = 0; round < 3; ++round) {
    absl::Status st[2];
    std::thread t([&] { st[1] = ExportShardSafetensors(*client_, manifest_, 0, path); });
    st[0] = ExportShardSafetensors(*client_, manifest_, 0, path);
    t.join();
    EXPECT_TRUE(st[0].ok()) << st[0];
    EXPECT_TRUE(st[1].ok()) << st[1];
    EXPECT_TRUE(gradsnap::testing::ReadFileOrEmpty(path) == want) << "round " << round;
    EXPECT_EQ(TempFilesIn(store_.path()), 0);
  }
}

TEST_F(SafetensorsExportTest, DirectoryDestinationIsRefusedBeforeReading) {
  absl::Status s = ExportShardSafetensors(*client_, manifest_, 0, store_.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("is a directory"), std::string::npos) << s;
  EXPECT_EQ(TempFilesIn(fs::path(store_.path()).parent_path().string()), 0);
}

}  // namespace
}  // namespace client
}  // namespace gradsnap
