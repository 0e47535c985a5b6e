// GPU tests (skipped without a CUDA device): the device AdamW equals the host replay bit for
// bit, and a full gockpt round trip on the CUDA device (pinned staging, side streams, events)
// reconstructs the stop-the-world state of step s+K-1 byte for byte.
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "gpu_snapshot/cuda_test_kernels.h"
#include "gpu_snapshot/device.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

struct DeviceArrays {
  Device* dev;
  float *p, *m, *v;
  void* g;
  size_t n;
};

// Null (the caller skips) only when the runtime reports no device or no driver; any other error
// fails the test.
std::unique_ptr<Device> CudaOrSkip() {
  absl::StatusOr<int> count = CudaDeviceCount();
  EXPECT_TRUE(count.ok()) << count.status();
  if (!count.ok() || *count == 0) return nullptr;
  auto d = NewCudaDevice(0);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  return std::move(*d);
}

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& f) {
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = FloatToBf16(f[i]);
  return out;
}

// The optimizer state on the device: copies of the host params, m and v (n floats each) and a
// gradient buffer of grad_bytes. Freed on destruction.
struct DeviceBuffers {
  DeviceBuffers(Device* dev, const std::vector<float>& params, const std::vector<float>& m,
              const std::vector<float>& v, size_t grad_bytes)
      : dev(dev), n(params.size()) {
    p = Upload(params);
    this->m = Upload(m);
    this->v = Upload(v);
    g = *dev->AllocDevice(grad_bytes);
  }
  ~DeviceBuffers() {
    for (void* d : {(void*)p, (void*)m, (void*)v, g}) dev->FreeDevice(d);
  }
  float* Upload(const std::vector<float>& host) {
    float* d = static_cast<float*>(*dev->AllocDevice(n * 4));
    EXPECT_TRUE(dev->CopyToDeviceSync(d, host.data(), n * 4).ok());
    return d;
  }
  // params, m and v back on the host, one after the other.
  std::vector<float> Download() const {
    std::vector<float> all(3 * n);
    const float* parts[] = {p, m, v};
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(dev->CopyToHostSync(all.data() + i * n, parts[i], n * 4).ok());
    }
    return all;
  }

  Device* const dev;
  const size_t n;
  float* p;
  float* m;
  float* v;
  void* g;
};

TEST(CudaSnapshotTest, DeviceAdamWEqualsHostReplay) {
  auto dev = CudaOrSkip();
  if (dev == nullptr) GTEST_SKIP() << "no CUDA device";
  const size_t n = 1 << 20;
  for (bool bf16 : {false, true}) {
    std::vector<float> p = Random(n, 1, 0.02f), m(n, 0.0f), v(n, 0.0f);
    DeviceBuffers d(dev.get(), p, m, v, n * 4);
    AdamWConfig cfg;
    for (int t = 1; t <= 5; ++t) {
      std::vector<float> g = Random(n, 100 + t, 1.0f);
      std::vector<uint16_t> gb = ToBf16(g);
      ASSERT_TRUE(dev->CopyToDeviceSync(d.g, bf16 ? (const void*)gb.data() : g.data(),
                                        n * (bf16 ? 2 : 4)).ok());
      AdamWStepParams h = MakeAdamWStepParams(cfg, 1e-3f * t, 0.7f, t);
      ASSERT_TRUE(DeviceAdamW(d.p, d.m, d.v, d.g, bf16, n, h));
      if (bf16) {
        AdamWUpdateHostBf16(p.data(), m.data(), v.data(), gb.data(), n, h);
      } else {
        AdamWUpdateHost(p.data(), m.data(), v.data(), g.data(), n, h);
      }
    }
    std::vector<float> want = p;
    want.insert(want.end(), m.begin(), m.end());
    want.insert(want.end(), v.begin(), v.end());
    const std::vector<float> got = d.Download();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << (bf16 ? "bf16" : "f32");
  }
}

class KeepSink : public SnapshotSink {
 public:
  void PersistFull(const HostSnapshot& s, DoneFn done) override {
    const size_t n = s.state.numel;
    std::vector<float> all(3 * n);
    std::memcpy(all.data(), s.state.params, n * 4);
    std::memcpy(all.data() + n, s.state.m, n * 4);
    std::memcpy(all.data() + 2 * n, s.state.v, n * 4);
    fulls[s.step] = std::move(all);
    done(absl::OkStatus());
  }
  void PersistDelta(const DeltaRecord&, DoneFn done) override { done(absl::OkStatus()); }
  std::map<int64_t, std::vector<float>> fulls;
};

TEST(CudaSnapshotTest, GockptRoundTripOnTheDevice) {
  auto dev = CudaOrSkip();
  if (dev == nullptr) GTEST_SKIP() << "no CUDA device";
  const size_t n = 3 << 20;
  DeviceBuffers d(dev.get(), Random(n, 2, 0.02f), std::vector<float>(n, 0.0f),
                std::vector<float>(n, 0.0f), n * 2);
  KeepSink sink;
  SnapshotEngineOptions o;
  o.window = 4;
  o.overlap_grads = true;
  o.grad_dtype = DType::kBF16;
  o.chunk_bytes = 1 << 20;
  auto engine = SnapshotEngine::Create(dev.get(), {d.p, d.m, d.v, n, 0, nullptr}, o, &sink);
  ASSERT_TRUE(engine.ok()) << engine.status();
  AdamWConfig cfg;
  std::map<int64_t, std::vector<float>> ref;
  for (int64_t u = 1; u <= 9; ++u) {
    ASSERT_TRUE((*engine)->BeforeGradOverwrite(u).ok());
    std::vector<uint16_t> gb = ToBf16(Random(n, 500 + u, 1.0f));
    ASSERT_TRUE(dev->CopyToDeviceSync(d.g, gb.data(), n * 2).ok());
    ASSERT_TRUE((*engine)->AfterBackward(u, d.g).ok());
    UpdateRecord info;
    info.step = u;
    info.params.skipped = u == 4;
    info.params.adamw = MakeAdamWStepParams(cfg, 1e-3f, 0.5f, u);
    if (!info.params.skipped) {
      ASSERT_TRUE(DeviceAdamW(d.p, d.m, d.v, d.g, true, n, info.params.adamw));
    }
    ASSERT_TRUE((*engine)->AfterUpdate(info, u == 2).ok());
    ref[u] = d.Download();
  }
  ASSERT_TRUE((*engine)->Finish().ok());
  ASSERT_EQ(sink.fulls.count(5), 1u);  // 2 + 4 - 1
  EXPECT_TRUE(sink.fulls[5] == ref[5]);
  EXPECT_LE((*engine)->host_bytes_peak(), 1.25 * (*engine)->state_bytes());
  engine->reset();
}

}  // namespace
}  // namespace gpu_snapshot
}  // namespace gradsnap
