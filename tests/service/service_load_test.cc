// Load: 16 concurrent clients upload for a bounded time while the test samples the server's
// resident memory from /proc/PID/status. At rest it must stay within a fixed overhead (kOverhead:
// binary, gRPC, RocksDB) plus the record buffers it faults in at start (kPrefault:
// --prefault-uploads and --prefault-read-ahead), and under load grow by at most
// --max-inflight-bytes + cache + kGrowthSlack (thread stacks, allocator slack), however many
// clients push.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "client/backends.h"
#include "client/client.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/service/service_test_util.h"

namespace gradsnap {
namespace testing {
namespace {

constexpr int kClients = 16;
constexpr double kSeconds = 3.0;
constexpr uint64_t kInflight = 128u << 20;
constexpr uint64_t kCache = 32u << 20;
constexpr uint64_t kOverhead = 128u << 20;
// 2 uploads x 6 buffers + 32 read-ahead buffers of a 4 MiB record (+ header, page-rounded).
constexpr uint64_t kPrefault = (2 * 6 + 32) * ((4u << 20) + (8u << 10));
constexpr uint64_t kGrowthSlack = 64u << 20;

TEST(ServiceLoad, SixteenClientsBoundedMemory) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server
                  .StartOn(dir.File("data"), "127.0.0.1:0",
                           {"--max-inflight-bytes", std::to_string(kInflight), "--cache-bytes",
                            std::to_string(kCache), "--metrics-listen", "127.0.0.1:0"})
                  .ok());
  const uint64_t rest_rss = server.RssBytes();
  std::atomic<bool> stop{false};
  std::atomic<int> saved{0};
  std::vector<std::string> errors(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      client::ClientOptions o;
      o.endpoints = {server.address()};
      o.max_attempts = 30;
      auto c = client::NewRemoteClient(o);
      if (!c.ok()) {
        errors[i] = c.status().ToString();
        return;
      }
      std::string job = "load-" + std::to_string(i);
      TestShard s = MakeShard(job, 0, 0, {6u << 20, 2u << 20}, i);
      for (int step = 0; step < 10000 && !stop; ++step) {
        s.spec.step = step;
        absl::Status st = (*c)->BeginCheckpoint(FullSpec(job, step, 1));
        if (st.ok()) st = (*c)->SaveShard(s.spec, s.Refs());
        if (!st.ok()) {
          errors[i] = st.ToString();
          return;
        }
        ++saved;
      }
    });
  }
  uint64_t peak = 0;
  Stopwatch w;
  while (w.ElapsedSeconds() < kSeconds) {
    peak = std::max(peak, server.RssBytes());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  for (auto& t : clients) t.join();
  peak = std::max(peak, server.RssBytes());
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(errors[i], "") << "client " << i;
  EXPECT_GE(saved.load(), kClients);
  std::printf("load: %d shards saved by %d clients in %.1f s; server RSS at rest %.1f MiB "
              "(bound %.1f), peak %.1f MiB (bound %.1f)\n",
              saved.load(), kClients, kSeconds, rest_rss / 1048576.0,
              (kOverhead + kPrefault) / 1048576.0, peak / 1048576.0,
              (rest_rss + kInflight + kCache + kGrowthSlack) / 1048576.0);
  EXPECT_LE(rest_rss, kOverhead + kPrefault);
  EXPECT_LE(peak, rest_rss + kInflight + kCache + kGrowthSlack);
  auto body = HttpGet(server.metrics_port());
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(MetricValue(*body, "gradsnap_inflight_bytes"), 0);
  EXPECT_LE(MetricValue(*body, "gradsnap_cache_bytes"), static_cast<double>(kCache));
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
