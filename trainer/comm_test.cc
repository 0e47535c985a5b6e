// GlooComm with real TCP pairs on 127.0.0.1: one thread per rank.
#include "trainer/comm.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "trainer/model_config.h"

namespace gradsnap {
namespace trainer {
namespace {

// Three ranks on threads: reduce-scatter, all-gather, all-reduce, send/recv and a barrier over
// flat buffers of `total` floats.
void RunCollectives(size_t total) {
  const int P = 3;
  const std::string dir = ::testing::TempDir() + "/comm_test_" + std::to_string(getpid()) + "_" +
                          std::to_string(total);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::vector<float>> reduced(P), gathered(P);
  std::vector<double> sums(P);
  std::vector<std::string> received(P);
  std::vector<absl::Status> status(P);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      auto comm = NewGlooComm(GlooOptions{r, P, dir, "test"});
      if (!comm.ok()) {
        status[r] = comm.status();
        return;
      }
      std::vector<float> g(total);
      for (size_t i = 0; i < total; ++i) g[i] = static_cast<float>(r + 1) * i;
      absl::Status s = (*comm)->ReduceScatter(g.data(), total);
      const RankSlice mine = SliceOfRank(total, r, P);
      reduced[r].assign(g.begin() + mine.lo, g.begin() + mine.hi);
      std::vector<float> params(total, -1.0f);
      for (size_t i = mine.lo; i < mine.hi; ++i) params[i] = static_cast<float>(i);
      if (s.ok()) s = (*comm)->AllGather(params.data(), total);
      gathered[r] = params;
      double v = r + 0.5;
      if (s.ok()) s = (*comm)->AllReduceSum(&v, 1);
      sums[r] = v;
      char buf[6] = {};
      if (s.ok() && r == 0) s = (*comm)->Send(1, 7, "hello", 5);
      if (s.ok() && r == 1) s = (*comm)->Recv(0, 7, buf, 5);
      received[r] = buf;
      if (s.ok()) s = (*comm)->Barrier();
      status[r] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    const RankSlice mine = SliceOfRank(total, r, P);
    for (size_t i = mine.lo; i < mine.hi; ++i) {
      ASSERT_EQ(reduced[r][i - mine.lo], 6.0f * i);  // (1 + 2 + 3) * i
    }
    for (size_t i = 0; i < total; ++i) ASSERT_EQ(gathered[r][i], static_cast<float>(i));
    EXPECT_DOUBLE_EQ(sums[r], 0.5 + 1.5 + 2.5);
  }
  EXPECT_EQ(received[1], "hello");
  std::filesystem::remove_all(dir);
}

TEST(GlooCommTest, CollectivesAndPointToPoint) { RunCollectives(1001); }

// Fewer elements than ranks: some slices are empty, and nothing is posted for them.
TEST(GlooCommTest, EmptySlices) { RunCollectives(2); }

// A peer that joined and then stops taking part (hung, frozen): the other's collective fails
// with UNAVAILABLE after op_timeout, not after the rendezvous timeout (300 s).
TEST(GlooCommTest, SilentPeerFailsTheCollectiveAfterTheOperationTimeout) {
  const std::string dir = ::testing::TempDir() + "/comm_test_silent_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  absl::Status status[2];
  absl::Notification done;
  std::thread peer([&] {
    GlooOptions o{1, 2, dir, "test"};
    auto comm = NewGlooComm(o);
    status[1] = comm.status();
    done.WaitForNotification();  // joined, then silent until rank 0 gave up
  });
  GlooOptions o{0, 2, dir, "test"};
  o.op_timeout = std::chrono::milliseconds(300);
  auto comm = NewGlooComm(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  double v = 1.0;
  status[0] = (*comm)->AllReduceSum(&v, 1);
  done.Notify();
  peer.join();
  EXPECT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(status[0].code(), absl::StatusCode::kUnavailable) << status[0];
  EXPECT_NE(status[0].message().find("Timed out waiting 300ms"), absl::string_view::npos)
      << status[0];
  std::filesystem::remove_all(dir);
}

// A group without a limit of its own (op_timeout 0, as for a device's collectives) waits for a
// silent peer until Abort, called from another thread as a deadline does; afterwards every
// operation fails at once.
TEST(GlooCommTest, AbortEndsAWaitOnASilentPeer) {
  const std::string dir = ::testing::TempDir() + "/comm_test_abort_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  absl::Status peer_status;
  absl::Notification done;
  std::thread peer([&] {
    auto comm = NewGlooComm(GlooOptions{1, 2, dir, "test"});
    peer_status = comm.status();
    done.WaitForNotification();
  });
  GlooOptions o{0, 2, dir, "test"};
  o.op_timeout = std::chrono::milliseconds(0);
  auto comm = NewGlooComm(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (*comm)->Abort();
  });
  std::vector<float> buf(1000, 1.0f);
  const absl::Status first = (*comm)->ReduceScatter(buf.data(), buf.size());
  aborter.join();
  double v = 1.0;
  const absl::Status later = (*comm)->AllReduceSum(&v, 1);
  done.Notify();
  peer.join();
  EXPECT_TRUE(peer_status.ok()) << peer_status;
  EXPECT_TRUE(absl::IsUnavailable(first)) << first;
  EXPECT_NE(first.message().find("aborted"), absl::string_view::npos) << first;
  EXPECT_EQ(later, absl::UnavailableError("gloo all-reduce: the group was aborted"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap
