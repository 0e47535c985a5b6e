// The step-line parsers the drills and tests read gradsnap-train's output with.
#include "tests/testing/trainer.h"

#include "gtest/gtest.h"

namespace gradsnap {
namespace testing {
namespace {

constexpr char kOutput[] =
    "ckpt step 5 gockpt start window=4\n"
    "step 1 loss 5.5 step_ms 42.3 stall_ms 0.1 ckpt_failures 0 recovery_point -1\n"
    "W18:38:02 persist_guard.cc:146] step 3 failed\n"
    "step 2 loss 5.4 step_ms 7.1 stall_ms 2.5 skipped ckpt_failures 3 recovery_point 1 "
    "recovery_age_s 0.4\n"
    "summary model=tiny step=2\n"
    "step 3 loss";  // a line still being written

TEST(StepLinesTest, ParseStepLinesReadsEveryStepLine) {
  const std::vector<StepLine> lines = ParseStepLines(kOutput);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].step, 1);
  EXPECT_DOUBLE_EQ(lines[0].step_ms, 42.3);
  EXPECT_EQ(lines[1].step, 2);
  EXPECT_DOUBLE_EQ(lines[1].stall_ms, 2.5);
  EXPECT_EQ(lines[1].ckpt_failures, 3);
  EXPECT_EQ(lines[1].recovery_point, 1);
  EXPECT_DOUBLE_EQ(lines[1].recovery_age_s, 0.4);
}

TEST(StepLinesTest, LastStepLineIsTheLastCompleteStepLine) {
  const StepLine l = LastStepLine(kOutput);
  EXPECT_EQ(l.step, 2);
  EXPECT_EQ(l.ckpt_failures, 3);
  EXPECT_EQ(LastStepLine("").step, 0);
  EXPECT_EQ(LastStepLine("summary\n").step, 0);
  EXPECT_EQ(LastStepLine("step 7 loss 1.0 step_ms 1\n").step, 7);
  EXPECT_EQ(LastStepLine("step 7 loss 1.0 step_ms 1").step, 7);  // no newline yet, but whole
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
