// The simulated asynchronous device (sim_device.h): launches return at once, copies wait for the
// compute events they are given (and only for those), the test hook that breaks the ordering,
// separate device and pinned memory, per-thread current device, and that a snapshot engine on
// one simulated device refuses another device's memory. No timing: every check is ordered by
// notifications.
#include "gpu_snapshot/sim_device.h"

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gpu_snapshot/copy_queue.h"
#include "gpu_snapshot/engine_test_util.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

SimOptions Fast() {
  SimOptions o;
  o.copy_gbps = 100;
  return o;
}

class NullSink : public SnapshotSink {
 public:
  void PersistFull(const HostSnapshot&, DoneFn done) override { done(absl::OkStatus()); }
  void PersistDelta(const DeltaRecord&, DoneFn done) override { done(absl::OkStatus()); }
};

// Simulated device `ordinal` opened with `options`, as the snapshot engine's Device; null (and a
// test failure) when it cannot be opened.
std::unique_ptr<Device> OpenSim(int ordinal, const SimOptions& options = Fast()) {
  absl::StatusOr<SimGpu*> gpu = SimGpu::Open(ordinal, options);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<Device>> dev = NewSimDevice(ordinal);
  EXPECT_TRUE(dev.ok()) << dev.status();
  return gpu.ok() && dev.ok() ? std::move(*dev) : nullptr;
}

// Tests that call Open get simulated device `ordinal`, current on the test's thread, with a
// compute stream and the snapshot engine's Device of it.
class SimDeviceTest : public ::testing::Test {
 protected:
  void Open(int ordinal, const SimOptions& options) {
    dev_ = OpenSim(ordinal, options);
    ASSERT_NE(dev_, nullptr);
    SimGpu* gpu = *SimGpu::Find(ordinal);
    current_.emplace(gpu);
    stream_ = gpu->NewStream();
  }

  std::optional<SimDeviceGuard> current_;  // destroyed last
  std::unique_ptr<SimStream> stream_;
  std::unique_ptr<Device> dev_;
};

TEST_F(SimDeviceTest, LaunchReturnsAtOnceAndCopiesWaitForTheirComputeEvent) {
  ASSERT_NO_FATAL_FAILURE(Open(0, Fast()));
  SimStream* stream = stream_.get();
  Device* dev = dev_.get();
  float* d = static_cast<float*>(*dev->AllocDevice(64 * sizeof(float)));
  float* h = static_cast<float*>(*dev->AllocPinned(64 * sizeof(float)));
  absl::Notification release;
  // The kernel blocks until released: Launch must return before it ran.
  ASSERT_TRUE(stream
                  ->Launch([&] {
                    release.WaitForNotification();
                    for (int i = 0; i < 64; ++i) d[i] = 1.0f + i;
                    return absl::OkStatus();
                  })
                  .ok());
  auto ev = dev->RecordComputeEvent(stream);
  ASSERT_TRUE(ev.ok()) << ev.status();
  auto copies = dev->NewStream(false);
  ASSERT_TRUE(copies.ok());
  ASSERT_TRUE((*copies)->WaitForEvent(ev->get()).ok());
  ASSERT_TRUE((*copies)->CopyToHost(h, d, 64 * sizeof(float)).ok());
  auto landed = (*copies)->RecordEvent();
  ASSERT_TRUE(landed.ok());
  EXPECT_FALSE((*landed)->Done()) << "a copy ran before the kernel it waits for";
  release.Notify();
  ASSERT_TRUE((*landed)->Wait().ok());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(h[i], 1.0f + i);
  ASSERT_TRUE(stream->Synchronize().ok());
  dev->FreeDevice(d);
  dev->FreePinned(h, 64 * sizeof(float));
}

// A copy waits for the compute event recorded when it was requested, not for the stream as it
// is when the copy queue gets around to dispatching it: here the request is dispatched only
// after a later kernel (blocked) was launched, and it must still land without that kernel.
TEST_F(SimDeviceTest, CopyQueueWaitsForTheEventOfTheRequestNotOfTheDispatch) {
  ASSERT_NO_FATAL_FAILURE(Open(0, Fast()));
  SimStream* stream = stream_.get();
  Device* dev = dev_.get();
  const size_t n = 4096;
  char* d = static_cast<char*>(*dev->AllocDevice(n));
  char* h = static_cast<char*>(*dev->AllocPinned(2 * n));
  auto q = CopyQueue::Create(dev, n, 1, nullptr);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(stream->Launch([&] {
                      std::memset(d, 7, n);
                      return absl::OkStatus();
                    }).ok());
  absl::Notification first_dispatched, later_launched, release;
  // A holds the dispatcher (its destination callback blocks) until the later kernel launched.
  CopyRequest a;
  a.src = d;
  a.bytes = n;
  a.dst = [&](size_t, size_t) {
    first_dispatched.Notify();
    later_launched.WaitForNotification();
    return h;
  };
  CopyRequest b;
  b.src = d;
  b.bytes = n;
  b.dst = [&](size_t, size_t) { return h + n; };
  auto ev = dev->RecordComputeEvent(stream);
  ASSERT_TRUE(ev.ok());
  b.after = *ev;  // after the memset, before the kernel below
  (*q)->Submit(std::move(a));
  CopyTicket tb = (*q)->Submit(std::move(b));
  first_dispatched.WaitForNotification();
  ASSERT_TRUE(stream->Launch([&] {
                      release.WaitForNotification();
                      std::memset(d, 9, n);
                      return absl::OkStatus();
                    }).ok());
  later_launched.Notify();
  ASSERT_TRUE((*q)->Wait(tb).ok());  // hangs if the copy waited for the blocked kernel
  EXPECT_EQ(h[n], 7);
  release.Notify();
  ASSERT_TRUE(stream->Synchronize().ok());
  q->reset();
  dev->FreeDevice(d);
  dev->FreePinned(h, 2 * n);
}

TEST_F(SimDeviceTest, UnorderedCopiesHookIgnoresComputeEvents) {
  SimOptions o = Fast();
  o.unordered_copies = true;
  ASSERT_NO_FATAL_FAILURE(Open(5, o));
  SimStream* stream = stream_.get();
  Device* dev = dev_.get();
  float* d = static_cast<float*>(*dev->AllocDevice(sizeof(float)));
  float* h = static_cast<float*>(*dev->AllocPinned(sizeof(float)));
  absl::Notification release;
  ASSERT_TRUE(stream
                  ->Launch([&] {
                    release.WaitForNotification();
                    d[0] = 42.0f;
                    return absl::OkStatus();
                  })
                  .ok());
  auto ev = dev->RecordComputeEvent(stream);
  auto copies = dev->NewStream(false);
  ASSERT_TRUE((*copies)->WaitForEvent(ev->get()).ok());
  ASSERT_TRUE((*copies)->CopyToHost(h, d, sizeof(float)).ok());
  ASSERT_TRUE((*copies)->Synchronize().ok());  // lands while the kernel is still blocked
  EXPECT_EQ(h[0], 0.0f);
  release.Notify();
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(d[0], 42.0f);
}

TEST_F(SimDeviceTest, CopiesNeedThisDevicesMemoryAndPinnedStaging) {
  std::unique_ptr<Device> dev1 = OpenSim(1), dev2 = OpenSim(2);
  ASSERT_TRUE(dev1 && dev2);
  void* on2 = *dev2->AllocDevice(256);
  void* pinned1 = *dev1->AllocPinned(256);
  std::vector<char> pageable(256);
  auto s = dev1->NewStream(true);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument((*s)->CopyToHost(pinned1, on2, 256)));
  void* on1 = *dev1->AllocDevice(256);
  EXPECT_TRUE(absl::IsInvalidArgument((*s)->CopyToHost(pageable.data(), on1, 256)));
  EXPECT_TRUE((*s)->CopyToHost(pinned1, on1, 256).ok());
  EXPECT_TRUE((*s)->Synchronize().ok());
  dev2->FreeDevice(on2);
  dev1->FreeDevice(on1);
  dev1->FreePinned(pinned1, 256);
}

// A rank that hands its snapshot engine another device (the bug of a fixed device 0) fails at
// once with a clear error instead of copying from the wrong place.
TEST_F(SimDeviceTest, EngineOnAnotherDeviceIsRefused) {
  std::unique_ptr<Device> mine = OpenSim(3), other = OpenSim(4);
  ASSERT_TRUE(mine && other);
  const size_t n = 4096;
  DeviceState st;
  st.params = static_cast<float*>(*mine->AllocDevice(n * 4));
  st.m = static_cast<float*>(*mine->AllocDevice(n * 4));
  st.v = static_cast<float*>(*mine->AllocDevice(n * 4));
  st.numel = n;
  NullSink sink;
  SnapshotEngineOptions eo;
  eo.mode = SnapshotMode::kGoCkpt;
  eo.overlap_grads = false;  // no steps run here
  auto bad = SnapshotEngine::Create(other.get(), st, eo, &sink);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not device memory of sim:4"), std::string::npos)
      << bad.status();
  // The compute stream of one device cannot order the copies of another.
  absl::StatusOr<SimGpu*> gpu3 = SimGpu::Find(3);
  ASSERT_TRUE(gpu3.ok());
  auto stream3 = (*gpu3)->NewStream();
  EXPECT_TRUE(absl::IsInvalidArgument(other->RecordComputeEvent(stream3.get()).status()));
  auto good = SnapshotEngine::Create(mine.get(), st, eo, &sink);
  EXPECT_TRUE(good.ok()) << good.status();
  good->reset();
  for (float* p : {st.params, st.m, st.v}) mine->FreeDevice(p);
}

TEST_F(SimDeviceTest, LaunchNeedsTheStreamsDeviceCurrent) {
  absl::StatusOr<SimGpu*> a = SimGpu::Open(1, Fast());
  absl::StatusOr<SimGpu*> b = SimGpu::Open(2, Fast());
  ASSERT_TRUE(a.ok() && b.ok());
  auto stream = (*a)->NewStream();
  {
    SimDeviceGuard wrong(*b);
    EXPECT_TRUE(absl::IsFailedPrecondition(stream->Launch([] { return absl::OkStatus(); })));
    {
      SimDeviceGuard right(*a);
      EXPECT_TRUE(stream->Launch([] { return absl::OkStatus(); }).ok());
    }
    EXPECT_EQ(CurrentSimGpu(), *b) << "the guard must restore the caller's device";
  }
  EXPECT_TRUE(stream->Synchronize().ok());
}

// The copy engine reads its source slice by slice: bytes written to the source while the copy
// is in flight (here by the test hook after the first slice) reach the slices not yet read.
char* g_slice_src = nullptr;
TEST_F(SimDeviceTest, CopyReadsItsSourceSliceBySlice) {
  constexpr size_t kBytes = 64 << 10;
  SimOptions o = Fast();
  o.after_slice = [](int slice, int) {
    if (slice == 0) std::memset(g_slice_src, 2, kBytes);  // "a kernel" overwrites the source
  };
  ASSERT_NO_FATAL_FAILURE(Open(6, o));
  char* d = static_cast<char*>(*dev_->AllocDevice(kBytes));
  char* h = static_cast<char*>(*dev_->AllocPinned(kBytes));
  std::memset(d, 1, kBytes);
  g_slice_src = d;
  auto copies = dev_->NewStream(false);
  ASSERT_TRUE(copies.ok());
  ASSERT_TRUE((*copies)->CopyToHost(h, d, kBytes).ok());
  ASSERT_TRUE((*copies)->Synchronize().ok());
  const size_t first = kBytes / kCopySlices;
  EXPECT_EQ(h[0], 1);
  EXPECT_EQ(h[first - 1], 1);
  EXPECT_EQ(h[first], 2) << "the copy read its whole source at its start";
  EXPECT_EQ(h[kBytes - 1], 2);
  dev_->FreeDevice(d);
  dev_->FreePinned(h, kBytes);
}

// late_copies: a copy of the late stream reads nothing until the host demands it or a kernel
// launched after its compute event overwrote its source; other streams' copies are not late.
TEST_F(SimDeviceTest, LateCopyReadsAfterTheOverwriteUnlessDemanded) {
  SimOptions o = Fast();
  o.late_copies = SimLateCopies::kState;
  ASSERT_NO_FATAL_FAILURE(Open(7, o));
  SimStream* stream = stream_.get();
  Device* dev = dev_.get();
  char* d = static_cast<char*>(*dev->AllocDevice(4096));
  char* h = static_cast<char*>(*dev->AllocPinned(3 * 4096));
  auto write = [&](char value) {
    return stream->Launch(
        [d, value] {
          std::memset(d, value, 4096);
          return absl::OkStatus();
        },
        {SimStream::Range{d, 4096}});
  };
  auto state_copies = dev->NewStream(/*high_priority=*/false);
  auto grad_copies = dev->NewStream(/*high_priority=*/true);
  ASSERT_TRUE(state_copies.ok() && grad_copies.ok());
  // Not demanded: the copy reads only after the next write of its source completed.
  ASSERT_TRUE(write(1).ok());
  auto ev = dev->RecordComputeEvent(stream);
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE((*state_copies)->WaitForEvent(ev->get()).ok());
  ASSERT_TRUE((*state_copies)->CopyToHost(h, d, 4096).ok());
  ASSERT_TRUE((*grad_copies)->WaitForEvent(ev->get()).ok());
  ASSERT_TRUE((*grad_copies)->CopyToHost(h + 4096, d, 4096).ok());
  ASSERT_TRUE((*grad_copies)->Synchronize().ok());  // not late: lands before the next write
  EXPECT_EQ(h[4096], 1);
  ASSERT_TRUE(write(2).ok());
  ASSERT_TRUE((*state_copies)->Synchronize().ok());
  EXPECT_EQ(h[0], 2) << "a late copy must lose the race with the write it was not waited for";
  // Demanded before the next write: it reads what its compute event ordered it after.
  ASSERT_TRUE(write(3).ok());
  ev = dev->RecordComputeEvent(stream);
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE((*state_copies)->WaitForEvent(ev->get()).ok());
  ASSERT_TRUE((*state_copies)->CopyToHost(h + 2 * 4096, d, 4096).ok());
  (*state_copies)->Demand();
  ASSERT_TRUE((*state_copies)->Synchronize().ok());
  ASSERT_TRUE(write(4).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(h[2 * 4096], 3);
  EXPECT_EQ(ParseSimLateCopies("grad").value(), SimLateCopies::kGradient);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseSimLateCopies("all").status()));
  dev->FreeDevice(d);
  dev->FreePinned(h, 3 * 4096);
}

// per_block_update_wait: the update of the slice but the block in flight runs while that
// block's copy is still to land; only the update of that block waits for it (its own copy, not
// the step's), and the FULL still equals the stop-the-world state. With late state copies a
// block copy lands only when the host demands it or a kernel overwrites it, so "not landed yet"
// is deterministic: an engine that waited for the block in AfterBackward (before the whole
// update) would have landed it there.
TEST_F(SimDeviceTest, UpdateWaitsOnlyForTheBlockInFlight) {
  SimOptions o = Fast();
  o.late_copies = SimLateCopies::kState;  // as LateCopyReadsAfterTheOverwriteUnlessDemanded
  ASSERT_NO_FATAL_FAILURE(Open(7, o));
  const size_t n = 6000;
  float* p = static_cast<float*>(*dev_->AllocDevice(n * 4));
  float* m = static_cast<float*>(*dev_->AllocDevice(n * 4));
  float* v = static_cast<float*>(*dev_->AllocDevice(n * 4));
  uint16_t* g = static_cast<uint16_t*>(*dev_->AllocDevice(n * 2));
  enginetest::State ref{std::vector<float>(n), std::vector<float>(n, 0.0f),
                        std::vector<float>(n, 0.0f)};
  for (size_t i = 0; i < n; ++i) ref.p[i] = p[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  enginetest::MemorySink sink;
  SnapshotEngineOptions eo;
  eo.mode = SnapshotMode::kGoCkpt;
  eo.window = 3;
  eo.grad_dtype = DType::kBF16;
  eo.per_block_update_wait = true;
  eo.chunk_bytes = 4096;
  DeviceState st{p, m, v, n, 0, stream_.get()};
  auto engine = SnapshotEngine::Create(dev_.get(), st, eo, &sink);
  ASSERT_TRUE(engine.ok()) << engine.status();
  SnapshotEngine& e = **engine;
  const uint64_t probe = e.counters().copied_bytes;
  auto update = [&](size_t b, size_t end, const AdamWStepParams& sp) {
    if (b >= end) return absl::OkStatus();
    return stream_->Launch(
        [=] {
          AdamWUpdateHostBf16(p + b, m + b, v + b, g + b, end - b, sp);
          return absl::OkStatus();
        },
        {SimStream::Range{p + b, (end - b) * 4}, SimStream::Range{m + b, (end - b) * 4},
         SimStream::Range{v + b, (end - b) * 4}});
  };
  std::map<int64_t, enginetest::State> reference;
  std::vector<uint16_t> host_g(n);
  for (int64_t u = 1; u <= 5; ++u) {
    ASSERT_TRUE(e.BeforeGradOverwrite(u).ok());
    for (size_t i = 0; i < n; ++i) {
      host_g[i] = FloatToBf16(0.001f * static_cast<float>((i * 7 + u * 13) % 101) - 0.05f);
    }
    ASSERT_TRUE(stream_->Launch(
                    [&] {
                      std::memcpy(g, host_g.data(), n * 2);
                      return absl::OkStatus();
                    },
                    {SimStream::Range{g, n * 2}})
                    .ok());
    ASSERT_TRUE(stream_->Synchronize().ok());  // the step's wait for the reduction
    ASSERT_TRUE(e.AfterBackward(u, g).ok());
    const ElemRange held = e.BlockInFlight();
    UpdateRecord info;
    info.step = u;
    info.params.adamw = MakeAdamWStepParams(AdamWConfig(), 1e-3f, 1.0f, u);
    const AdamWStepParams& sp = info.params.adamw;
    if (u >= 2 && u <= 4) {  // block u-2, copied after update u-1, is in flight
      ASSERT_FALSE(held.empty()) << "step " << u;
      EXPECT_EQ(held.begin, n * (u - 2) / 3 / 16 * 16);
      EXPECT_EQ(held.end, u == 4 ? n : n * (u - 1) / 3 / 16 * 16);
    } else {
      EXPECT_TRUE(held.empty()) << "step " << u;
    }
    if (!held.empty()) {
      ASSERT_TRUE(update(0, held.begin, sp).ok());
      ASSERT_TRUE(update(held.end, n, sp).ok());
    }
    if (u == 2) {
      // The rest of the update ran; the block's copy has not landed (nothing demanded it and
      // no kernel wrote it).
      ASSERT_TRUE(stream_->Synchronize().ok());
      EXPECT_EQ(e.counters().copied_bytes, probe)
          << "the block copy landed before the update of the other blocks";
    }
    ASSERT_TRUE(e.BeforeBlockUpdate(u).ok());
    if (u == 2) {
      EXPECT_GE(e.counters().copied_bytes, probe + 3 * (held.end - held.begin) * 4);
    }
    ASSERT_TRUE(held.empty() ? update(0, n, sp).ok() : update(held.begin, held.end, sp).ok());
    AdamWUpdateHostBf16(ref.p.data(), ref.m.data(), ref.v.data(), host_g.data(), n, sp);
    reference[u] = ref;
    ASSERT_TRUE(e.AfterUpdate(info, /*checkpoint_due=*/u == 1).ok());
    e.TakeStepStats();
  }
  ASSERT_TRUE(e.Finish().ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  ASSERT_EQ(sink.fulls.count(3), 1u) << "window K=3 started after update 1";
  EXPECT_TRUE(sink.fulls.at(3) == reference.at(3));
  engine->reset();
  for (void* q : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v),
                  static_cast<void*>(g)}) {
    dev_->FreeDevice(q);
  }
}

TEST_F(SimDeviceTest, BadOrdinalsAndBandwidth) {
  EXPECT_TRUE(absl::IsInvalidArgument(SimGpu::Open(kSimDeviceCount, Fast()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(SimGpu::Open(-1, Fast()).status()));
  SimOptions zero;
  zero.copy_gbps = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(SimGpu::Open(0, zero).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(NewSimDevice(-3).status()));
}

TEST_F(SimDeviceTest, CheckDevicesNamesTheRangeAndTheFlags) {
  EXPECT_TRUE(CheckDevices(DeviceKind::kCpu, 0, 64).ok());
  EXPECT_TRUE(CheckDevices(DeviceKind::kSim, 0, kSimDeviceCount).ok());
  const absl::Status over = CheckDevices(DeviceKind::kSim, 7, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(over));
  EXPECT_NE(over.message().find("needs sim devices 7..8; 8 present"), std::string::npos) << over;
  EXPECT_TRUE(absl::IsInvalidArgument(CheckDevices(DeviceKind::kSim, -1, 1)));
  // An unknown kind is refused where the string is parsed.
  const absl::StatusOr<DeviceKind> tpu = ParseDeviceKind("tpu");
  EXPECT_TRUE(absl::IsInvalidArgument(tpu.status()));
  EXPECT_EQ(tpu.status().message(), "--device must be cpu, cuda or sim");
  for (DeviceKind d : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kSim}) {
    EXPECT_EQ(ParseDeviceKind(DeviceKindName(d)).value(), d);
  }
  // cuda: UNIMPLEMENTED without CUDA, FAILED_PRECONDITION without a device, never a crash.
  const absl::Status cuda = CheckDevices(DeviceKind::kCuda, 0, 1);
  if (!CudaCompiledIn()) {
    EXPECT_TRUE(absl::IsUnimplemented(cuda)) << cuda;
  }
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.message().rfind("--device cuda", 0), 0u) << cuda;
  }
}

}  // namespace
}  // namespace gpu_snapshot
}  // namespace gradsnap
