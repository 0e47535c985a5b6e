// GPU end to end (label gpu; scripts/gpu-check.sh): gradsnap-train --device cuda with gockpt
// (K = 3 > 1, bf16 gradients, the gradient log, -O) against a stop-the-world sync run of the
// same job: every FULL and every FULL + DELTA replay byte-identical to the sync snapshot of its
// step, same losses and params_sha256. Skips only when cudaGetDeviceCount reports no device or
// no driver; any other CUDA error fails.
#include "absl/strings/str_cat.h"
#include "gpu_snapshot/device.h"
#include "gtest/gtest.h"
#include "tests/snapshot/e2e_util.h"
#include "tests/testing/temp_dir.h"

namespace gradsnap {
namespace {

std::vector<std::string> Base(const std::string& dir) {
  return {"--model=tiny", "--steps=12",         "--batch=4",    "--warmup=3",
          "--grad_clip=0.5", "--test_skip_step=6", "--device=cuda",
          absl::StrCat("--ckpt_dir=", dir)};
}

TEST(GpuE2E, CudaGockptGradLogOverlapEqualsSync) {
  absl::StatusOr<int> devices = gpu_snapshot::CudaDeviceCount();
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (*devices == 0) GTEST_SKIP() << "no CUDA device";
  const testing::TempDir tmp("gpu_e2e");
  const std::string scratch = tmp.path();
  std::vector<std::string> a = Base(scratch + "/ref");
  a.insert(a.end(), {"--ckpt_mode=sync", "--ckpt_every=1", "--job=ref"});
  e2e::TrainRun ref = e2e::Train(GRADSNAP_TRAIN_PATH, scratch, "ref", a);
  ASSERT_EQ(ref.rc, 0) << ref.out;
  std::vector<std::string> b = Base(scratch + "/g");
  b.insert(b.end(), {"--ckpt_mode=gockpt", "--ckpt_every=4", "--gockpt_window=3",
                     "--gockpt_overlap=true", "--grad_log", "--job=g"});
  e2e::TrainRun g = e2e::Train(GRADSNAP_TRAIN_PATH, scratch, "g", b);
  ASSERT_EQ(g.rc, 0) << g.out;
  EXPECT_EQ(g.sha, ref.sha) << "checkpointing changed training";
  EXPECT_EQ(g.losses, ref.losses);
  e2e::Store got(scratch + "/g"), ref_store(scratch + "/ref");
  const e2e::Checked c = e2e::ExpectEqualsReference(got, "g", ref_store, "ref", 1, "cuda gockpt");
  EXPECT_GE(c.fulls, 1) << g.out;
  EXPECT_GE(c.deltas, 3) << g.out;
}

}  // namespace
}  // namespace gradsnap
