// Many small tensors with the default 4 MiB chunks: each is a chunk staged in a small record
// buffer, many in flight at once (shard_writer.cc, kSmallJobsPerJob); all of them come back
// byte-exact and verified, with io_uring and with the pwrite path, and tensors larger than a
// small buffer mix in.
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/chunk_codec.h"
#include "storage/engine.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {
namespace {

class SmallChunksTest : public ::testing::TestWithParam<bool> {};

TEST_P(SmallChunksTest, ManySmallTensorsRoundTrip) {
  TempDir dir;
  EngineOptions o;
  o.data_dir = dir.path();
  o.use_io_uring = GetParam();
  o.zstd_level = 1;
  o.adapt_compression = false;  // every chunk tries compression: small alt buffers too
  auto e = Engine::Open(o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->BeginCheckpoint({"sc", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d;
  d.spec.job = "sc";
  d.spec.step = 1;
  d.spec.rank = 0;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 600; ++i) {
    // Mostly 4 B-256 KiB, exactly the small-buffer limit, and every 50th above it.
    int64_t numel = i % 50 == 49 ? 300000 + i
                    : i % 50 == 48 ? static_cast<int64_t>(kSmallChunkBytes / 4)
                                   : 1 + static_cast<int64_t>(rng() % (kSmallChunkBytes / 4));
    d.spec.tensors.push_back(Tensor(absl::StrCat("t", i), DType::kF32, numel));
    d.bytes.push_back(i % 3 == 0 ? WeightBytes(numel, i) : RandomBytes(numel * 4, i));
  }
  ASSERT_TRUE((*e)->WriteShard(d.spec, d.ptrs()).ok());
  ExpectRestores(e->get(), d);
  EXPECT_TRUE((*e)->Verify("sc", 1).ok());
}

INSTANTIATE_TEST_SUITE_P(IoPaths, SmallChunksTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "io_uring" : "pwrite";
                         });

}  // namespace
}  // namespace storage
}  // namespace gradsnap
