// The remote-only client library, gradsnap::client_remote: this binary links it and not
// gradsnap::client, so it holds no storage engine and no RocksDB (the ctest test
// service_remote_only_links_no_rocksdb checks its symbols). Against a real gradsnap-server it
// saves, lists, verifies and restores like the full library.
#include <string>

#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/service/service_test_util.h"

namespace gradsnap {
namespace testing {
namespace {

TEST(RemoteOnlyClient, SavesListsVerifiesAndRestoresThroughAServer) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir.File("data")).ok());
  client::ClientOptions o;
  o.endpoints = {server.address()};
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  TestShard r0 = MakeShard("remote-only", 7, 0, {3u << 20, 4096}, 1);
  TestShard r1 = MakeShard("remote-only", 7, 1, {1u << 20}, 2);
  ASSERT_TRUE((*c)->BeginCheckpoint(FullSpec("remote-only", 7, 2)).ok());
  ASSERT_TRUE((*c)->SaveShard(r0.spec, r0.Refs()).ok());
  ASSERT_TRUE((*c)->SaveShard(r1.spec, r1.Refs()).ok());
  auto listed = (*c)->List("remote-only");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].step, 7);
  EXPECT_EQ((*listed)[0].state, client::CheckpointState::kCommitted);
  EXPECT_TRUE((*c)->Verify("remote-only", 7).ok());
  for (const TestShard* s : {&r0, &r1}) {
    auto got = RestoreToString(c->get(), "remote-only", 7, s->spec.rank);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == s->Payload()) << "rank " << s->spec.rank;
  }
}

TEST(RemoteOnlyClient, NeedsEndpointsAndValidOptions) {
  client::ClientOptions o;
  o.local_dir = "checkpoints";  // the embedded back end is not in this library
  EXPECT_EQ(client::Client::ConnectRemote(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.endpoints = {"127.0.0.1:1"};
  o.max_attempts = 0;
  EXPECT_EQ(client::Client::ConnectRemote(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.max_attempts = 1;
  o.endpoints = {"no-port"};
  EXPECT_EQ(client::Client::ConnectRemote(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
