// Unit tests of the service's parts that need no server: the RAM tier (ShardCache), the
// in-flight limiter, request validation (proto/convert.h) and rendezvous placement.
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "client/remote_placement.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "service/inflight_limiter.h"
#include "service/shard_cache.h"

namespace gradsnap {
namespace service {
namespace {

CachedShard Shard(size_t n, char c) {
  CachedShard s;
  std::string a(n / 2, c), b(n - n / 2, static_cast<char>(c + 1));
  EXPECT_TRUE(s.Append(a.data(), a.size(), n));
  EXPECT_TRUE(s.Append(b.data(), b.size(), n));
  return s;
}

void Put(ShardCache* cache, const std::string& job, int64_t step, int32_t rank, size_t n) {
  ASSERT_TRUE(cache->Reserve(job, step, n));
  cache->Publish(job, step, rank, Shard(n, 'x'));
}

TEST(ShardCache, ServesOnlyCommittedNewestStepAndStaysInBudget) {
  ShardCache cache(1000);
  Put(&cache, "a", 1, 0, 300);
  EXPECT_EQ(cache.Lookup("a", 1, 0), nullptr);  // not committed yet
  cache.Committed("a", 1);
  ASSERT_NE(cache.Lookup("a", 1, 0), nullptr);
  std::vector<grpc::Slice> refs;
  EXPECT_EQ(PayloadSlices(cache.Lookup("a", 1, 0), 148, 4, &refs), 4u);
  std::string out;
  for (const grpc::Slice& r : refs) out.append(reinterpret_cast<const char*>(r.begin()), r.size());
  EXPECT_EQ(out, "xxyy");
  Put(&cache, "a", 2, 0, 300);
  EXPECT_NE(cache.Lookup("a", 1, 0), nullptr);  // step 2 still pending: step 1 stays
  cache.Committed("a", 2);
  EXPECT_EQ(cache.Lookup("a", 1, 0), nullptr);
  EXPECT_NE(cache.Lookup("a", 2, 0), nullptr);
  EXPECT_EQ(cache.used(), 300u);
  cache.Drop("a", 2);
  EXPECT_EQ(cache.Lookup("a", 2, 0), nullptr);
  EXPECT_EQ(cache.used(), 0u);
}

// An entry staged for an earlier checkpoint saved under the same step (its delete or abort
// missed it) is not served once the step commits with other content: the committed
// manifest's digests decide. Entries that match, and those of other ranks' matching shards,
// stay readable.
TEST(ShardCache, CommitDropsEntriesOfAnotherVersionOfTheStep) {
  ShardCache cache(1000);
  auto info = [](int32_t rank, const std::string& digest) {
    storage::ShardInfo i;
    i.rank = rank;
    storage::TensorInfo t;
    t.spec.name = "w";
    t.spec.byte_length = 100;
    t.digest = digest;
    i.tensors.push_back(t);
    return i;
  };
  for (int32_t rank : {0, 1, 2}) {
    ASSERT_TRUE(cache.Reserve("v", 3, 100));
    CachedShard shard = Shard(100, 'x');
    shard.info = info(rank, rank == 1 ? "old" : "new");
    cache.Publish("v", 3, rank, std::move(shard));
  }
  // The committed checkpoint: rank 1 holds other content now, rank 2 is not in it.
  const std::vector<storage::ShardInfo> manifest = {info(0, "new"), info(1, "new")};
  cache.Committed("v", 3, &manifest);
  EXPECT_NE(cache.Lookup("v", 3, 0), nullptr);
  EXPECT_EQ(cache.Lookup("v", 3, 1), nullptr) << "an old version of rank 1 was served";
  EXPECT_EQ(cache.Lookup("v", 3, 2), nullptr);
  EXPECT_EQ(cache.used(), 100u);
  cache.DropJob("v");
  EXPECT_EQ(cache.Lookup("v", 3, 0), nullptr);
  EXPECT_EQ(cache.used(), 0u);
}

// A DELTA's commit keeps its base FULL and the DELTAs between; a FULL's drops them. Room for a
// new FULL comes from the job's superseded steps before any other job's; room for a DELTA from
// other jobs before the chain it extends.
TEST(ShardCache, KeepsTheChainOfTheNewestDelta) {
  ShardCache cache(1000);
  Put(&cache, "a", 10, 0, 300);
  cache.Committed("a", 10);
  ASSERT_TRUE(cache.Reserve("a", 11, 10, 100));
  cache.Publish("a", 11, 0, Shard(100, 'd'));
  cache.Committed("a", 11, 10);
  ASSERT_TRUE(cache.Reserve("a", 12, 10, 100));
  cache.Publish("a", 12, 0, Shard(100, 'd'));
  cache.Committed("a", 12, 10);
  for (int64_t step : {10, 11, 12}) EXPECT_NE(cache.Lookup("a", step, 0), nullptr) << step;
  Put(&cache, "b", 1, 0, 400);
  cache.Committed("b", 1);
  // A DELTA of a's chain that needs room: b goes, not a's base FULL.
  ASSERT_TRUE(cache.Reserve("a", 13, 10, 200));
  EXPECT_EQ(cache.Lookup("b", 1, 0), nullptr);
  EXPECT_NE(cache.Lookup("a", 10, 0), nullptr);
  cache.Unreserve(200);
  Put(&cache, "b", 2, 0, 400);
  cache.Committed("b", 2);
  // A new FULL of a that needs room: a's old chain goes (superseded), b stays.
  Put(&cache, "a", 20, 0, 300);
  EXPECT_NE(cache.Lookup("b", 2, 0), nullptr);
  cache.Committed("a", 20);
  for (int64_t step : {10, 11, 12}) EXPECT_EQ(cache.Lookup("a", step, 0), nullptr) << step;
  EXPECT_NE(cache.Lookup("a", 20, 0), nullptr);
  EXPECT_EQ(cache.used(), 700u);
  // An older step committing late does not move the chain back.
  Put(&cache, "a", 15, 0, 100);
  cache.Committed("a", 15);
  EXPECT_EQ(cache.Lookup("a", 15, 0), nullptr);
  EXPECT_NE(cache.Lookup("a", 20, 0), nullptr);
  EXPECT_EQ(cache.used(), 700u);
}

TEST(ShardCache, EvictsLeastRecentlyUsedJobs) {
  ShardCache cache(1000);
  for (const char* job : {"a", "b", "c"}) {
    Put(&cache, job, 1, 0, 300);
    cache.Committed(job, 1);
  }
  ASSERT_NE(cache.Lookup("a", 1, 0), nullptr);  // a is now more recent than b
  Put(&cache, "d", 1, 0, 300);                  // evicts b, the least recently used
  cache.Committed("d", 1);
  EXPECT_NE(cache.Lookup("a", 1, 0), nullptr);
  EXPECT_EQ(cache.Lookup("b", 1, 0), nullptr);
  EXPECT_NE(cache.Lookup("c", 1, 0), nullptr);
  EXPECT_LE(cache.used(), 1000u);
  EXPECT_FALSE(cache.Reserve("e", 1, 1001));  // larger than the whole budget
  ShardCache off(0);
  EXPECT_FALSE(off.Reserve("a", 1, 1));
}

TEST(CachedShard, BlocksHoldThePayloadInOrderAndRefuseExtraBytes) {
  const size_t kBlock = CachedShard::kBlockBytes;
  const uint64_t total = 2 * kBlock + 12345;  // two full blocks and a small tail
  std::string payload(total, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 + i / 4096);
  CachedShard shard;
  // Odd-sized pieces, as gRPC delivers them, crossing the block boundaries.
  for (size_t off = 0; off < total;) {
    const size_t n = std::min<size_t>(777777, total - off);
    ASSERT_TRUE(shard.Append(payload.data() + off, n, total));
    off += n;
  }
  ASSERT_EQ(shard.size, total);
  ASSERT_EQ(shard.pieces.size(), 3u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(shard.pieces[i].size(), kBlock);
  // The tail block is sized to what was left (page-rounded).
  EXPECT_EQ(shard.pieces[2].size(), 12345u);
  EXPECT_LT(shard.pieces[2].room(), 4096u);
  // More bytes than announced: refused, nothing appended.
  std::string extra(8192, 'z');
  EXPECT_FALSE(shard.Append(extra.data(), extra.size(), total));
  EXPECT_EQ(shard.size, total);
  // Read back across the boundaries, through the slices a Read answer sends.
  auto p = std::make_shared<const CachedShard>(std::move(shard));
  std::vector<grpc::Slice> refs;
  const uint64_t from = kBlock - 100;
  ASSERT_EQ(PayloadSlices(p, from, total - from, &refs), total - from);
  EXPECT_EQ(refs.size(), 3u);
  std::string out;
  for (const grpc::Slice& r : refs) out.append(reinterpret_cast<const char*>(r.begin()), r.size());
  EXPECT_TRUE(out == payload.substr(from));
}

TEST(InflightLimiter, BlocksThenAdmits) {
  Counter gauge;
  InflightLimiter limiter(100, &gauge);
  EXPECT_TRUE(limiter.Acquire(60, absl::ZeroDuration()));
  EXPECT_FALSE(limiter.Acquire(60, absl::Milliseconds(10)));
  EXPECT_FALSE(limiter.Acquire(101, absl::Seconds(1)));
  EXPECT_EQ(gauge.Value(), 60);
  std::thread release([&] { limiter.Release(60); });
  EXPECT_TRUE(limiter.Acquire(60, absl::Seconds(30)));
  release.join();
  {
    InflightReservation r;
    EXPECT_TRUE(r.Acquire(&limiter, 40, absl::ZeroDuration()));
    EXPECT_EQ(limiter.in_use(), 100u);
  }
  EXPECT_EQ(limiter.in_use(), 60u);
}

TEST(Convert, RejectsMalformedSpecs) {
  v1::ShardSpec s;
  s.set_job("job");
  s.set_step(1);
  auto* t = s.add_tensors();
  t->set_name("w");
  t->set_dtype(v1::DTYPE_F32);
  t->add_shape(2);
  t->add_shape(3);
  t->set_byte_length(24);
  ASSERT_TRUE(proto::FromProto(s).ok());
  auto bad = [&](auto edit) {
    v1::ShardSpec c = s;
    edit(&c);
    return proto::FromProto(c).status().code();
  };
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad([](v1::ShardSpec* c) { c->set_job(".."); }), kBad);
  EXPECT_EQ(bad([](v1::ShardSpec* c) { c->set_rank(-1); }), kBad);
  EXPECT_EQ(bad([](v1::ShardSpec* c) { c->mutable_tensors(0)->set_byte_length(25); }), kBad);
  EXPECT_EQ(bad([](v1::ShardSpec* c) { c->mutable_tensors(0)->set_dtype(v1::DType(9)); }), kBad);
  EXPECT_EQ(bad([](v1::ShardSpec* c) { *c->add_tensors() = c->tensors(0); }), kBad);  // dup
  EXPECT_EQ(bad([](v1::ShardSpec* c) {
              auto* t = c->mutable_tensors(0);
              t->clear_shape();
              for (int i = 0; i < 8; ++i) t->add_shape(int64_t{1} << 40);  // overflow
            }),
            kBad);
  EXPECT_EQ(bad([](v1::ShardSpec* c) { c->mutable_tensors(0)->set_sha256("ABC"); }), kBad);
  EXPECT_EQ(bad([](v1::ShardSpec* c) {
              c->mutable_tensors(0)->set_flat_name("flat");
              c->mutable_tensors(0)->set_flat_total(3);
            }),
            kBad);
}

TEST(Placement, StableSpreadAndMinimalMovement) {
  std::vector<std::string> three = {"h1:1", "h2:1", "h3:1"};
  std::vector<std::string> four = {"h1:1", "h2:1", "h3:1", "h4:1"};
  std::vector<int> first(3, 0);
  int moved_elsewhere = 0;
  for (int32_t rank = 0; rank < 3000; ++rank) {
    auto a = client::RankEndpoints(three, "job", rank);
    EXPECT_EQ(a, client::RankEndpoints(three, "job", rank));  // deterministic
    EXPECT_EQ(std::set<size_t>(a.begin(), a.end()).size(), 3u);
    ++first[a[0]];
    auto b = client::RankEndpoints(four, "job", rank);
    // Adding a node only moves shards onto the new node.
    if (b[0] != a[0] && b[0] != 3) ++moved_elsewhere;
  }
  for (int n : first) EXPECT_GT(n, 800);  // roughly even
  EXPECT_EQ(moved_elsewhere, 0);
}

}  // namespace
}  // namespace service
}  // namespace gradsnap
