// GoogleTest helpers of the tests (header-only: the rest of tests/testing/ has no GoogleTest,
// so the fault drill can link it).
#ifndef GRADSNAP_TESTS_TESTING_GTEST_UTIL_H_
#define GRADSNAP_TESTS_TESTING_GTEST_UTIL_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace testing {

// The object `made` holds, or nullptr and a test failure naming its status (for helpers that
// open engines and clients: the test then stops at its ASSERT_NE(x, nullptr)).
template <typename T>
std::unique_ptr<T> ValueOrNull(absl::StatusOr<std::unique_ptr<T>> made) {
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

// For ASSERT_TRUE(IsOk(s)) / EXPECT_TRUE(IsOk(s)): passes when `s` is OK, else fails with it.
inline ::testing::AssertionResult IsOk(const absl::Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s;
}

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_GTEST_UTIL_H_
