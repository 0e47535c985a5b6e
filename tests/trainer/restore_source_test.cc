// The resume's reads wait out a server outage (trainer/shard_store.h, NewRestoreSource): a real
// gradsnap-server is SIGKILLed after a checkpoint committed and restarted on the same address
// 1 s later; List, Describe and Read through the restore source of a store whose client gives
// up after ~0.4 s (the trainer's 4 attempts) all succeed once the server is back. The same
// client's own call fails UNAVAILABLE during the outage, so the waiting is the restore source's.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "recovery/state_source.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"
#include "trainer/shard_store.h"

namespace gradsnap {
namespace {

constexpr char kJob[] = "outage";
constexpr int64_t kStep = 7;

// One FULL checkpoint of one rank holding one fp32 tensor of `values`.
absl::Status SaveOneTensor(client::Client& c, const std::vector<float>& values) {
  client::CheckpointSpec cs;
  cs.job = kJob;
  cs.step = kStep;
  RETURN_IF_ERROR(c.BeginCheckpoint(cs));
  client::ShardSpec ss;
  ss.job = kJob;
  ss.step = kStep;
  client::TensorRef t;
  t.spec.name = "w";
  t.spec.dtype = DType::kF32;
  t.spec.shape = {static_cast<int64_t>(values.size())};
  t.spec.byte_length = values.size() * sizeof(float);
  t.data = values.data();
  ss.tensors = {t.spec};
  return c.SaveShard(ss, {t});
}

TEST(RestoreSourceTest, ReadsWaitOutAServerOutage) {
  const testing::TempDir dir("restore-source");
  testing::ServerProcess server(GRADSNAP_SERVER_BIN);
  absl::StatusOr<int> port = testing::FreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_TRUE(server.StartOn(dir.path() + "/server", absl::StrCat("127.0.0.1:", *port)).ok());

  client::ClientOptions co;
  co.endpoints = {server.address()};
  co.max_attempts = 4;  // as the trainer: retries for ~0.4 s, less than the 1 s outages below
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(co);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> values(4096);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE(SaveOneTensor(**c, values).ok());
  std::unique_ptr<trainer::ShardStore> store = trainer::NewDirectShardStore(std::move(*c));
  std::unique_ptr<recovery::StateSource> source = trainer::NewRestoreSource(*store, kJob);
  ASSERT_NE(source, nullptr);

  server.Kill();
  EXPECT_TRUE(absl::IsUnavailable(store->client()->List(kJob, false).status()));
  std::thread back([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const absl::Status st = server.Restart();
    EXPECT_TRUE(st.ok()) << st;
  });
  absl::StatusOr<std::vector<storage::CheckpointInfo>> list = source->List();
  back.join();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ(list->front().step, kStep);

  // Down again, in the middle of the restore: the describe and the read wait too.
  server.Kill();
  std::thread back_again([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const absl::Status st = server.Restart();
    EXPECT_TRUE(st.ok()) << st;
  });
  absl::StatusOr<recovery::CheckpointView> view = source->Describe(kStep);
  ASSERT_TRUE(view.ok()) << view.status();
  std::vector<float> got(values.size());
  const absl::Status read =
      source->Read(kStep, 0, "w", 0, got.size() * sizeof(float), got.data());
  back_again.join();
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(std::memcmp(got.data(), values.data(), got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace gradsnap
