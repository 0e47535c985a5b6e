// PersistBacklog's budget and the --ckpt-backlog-bytes values it is given.
#include "trainer/persist_backlog.h"

#include "gtest/gtest.h"

namespace gradsnap {
namespace trainer {
namespace {

TEST(PersistBacklogTest, ParsesAutoAndByteCounts) {
  EXPECT_EQ(*ParseBacklogBytes("auto"), 0u);
  EXPECT_EQ(*ParseBacklogBytes("1"), 1u);
  EXPECT_EQ(*ParseBacklogBytes("268435456"), 268435456u);
  EXPECT_EQ(*ParseBacklogBytes("64K"), 64u << 10);
  EXPECT_EQ(*ParseBacklogBytes("64m"), 64u << 20);
  EXPECT_EQ(*ParseBacklogBytes("2G"), 2ull << 30);
  for (const char* bad : {"0", "0M", "", "-5", "+5", "1.5G", "M", "12X", "auto ", "1e9",
                          "99999999999999999999", "17179869184G"}) {
    absl::StatusOr<uint64_t> v = ParseBacklogBytes(bad);
    ASSERT_FALSE(v.ok()) << "'" << bad << "' gave " << *v;
    EXPECT_TRUE(absl::IsInvalidArgument(v.status()));
    EXPECT_NE(v.status().message().find(std::string("not '") + bad + "'"), std::string::npos)
        << v.status();
  }
}

TEST(PersistBacklogTest, AutoHoldsOneFullAndSomeDeltas) {
  const uint64_t full = 3 * kBacklogAutoMinBytes, delta = 1 << 20;
  EXPECT_EQ(AutoBacklogBytes(full, delta, false), full);
  EXPECT_EQ(AutoBacklogBytes(full, delta, true), full + kBacklogAutoDeltas * delta);
  EXPECT_EQ(AutoBacklogBytes(1200, 200, true), kBacklogAutoMinBytes);  // the floor
}

TEST(PersistBacklogTest, ReservesWithinTheBudgetOnly) {
  PersistBacklog b(100);
  EXPECT_FALSE(b.TryReserve(101));
  EXPECT_TRUE(b.TryReserve(60));
  EXPECT_FALSE(b.TryReserve(41));  // nothing reserved by a refusal
  EXPECT_TRUE(b.TryReserve(40));
  EXPECT_EQ(b.usage().used, 100u);
  b.Release(60);
  EXPECT_TRUE(b.TryReserve(60));
  b.Release(100);
  EXPECT_EQ(b.usage().used, 0u);
  EXPECT_EQ(b.usage().peak, 100u);
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap
