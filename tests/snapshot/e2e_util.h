// Helpers of the snapshot end-to-end tests on the simulated and the CUDA device: run the real
// gradsnap-train, parse its output, read checkpoints back through the client library, and
// compare a run's checkpoints with a stop-the-world reference byte for byte.
#ifndef GRADSNAP_TESTS_SNAPSHOT_E2E_UTIL_H_
#define GRADSNAP_TESTS_SNAPSHOT_E2E_UTIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace gradsnap {
namespace e2e {

struct TrainRun {
  int rc = -1;
  std::string out;
  std::map<int64_t, std::string> losses;  // step -> loss text
  std::string sha;
  int64_t resumed_from = -1;
  std::vector<int64_t> started;  // steps at which a FULL checkpoint started ("ckpt step S ...")
};

// Runs `train_bin args...`, parses its output and keeps it in scratch/name.out.
TrainRun Train(const std::string& train_bin, const std::string& scratch, const std::string& name,
               const std::vector<std::string>& args);

// A test suite whose tests share one scratch directory (and the reference runs in it): made
// before the suite's first test, removed after its last. A derived SetUpTestSuite calls
// ScratchSuite::SetUpTestSuite first.
class ScratchSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tmp_ = new testing::TempDir("e2e"); }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static const std::string& scratch() { return tmp_->path(); }

 private:
  static testing::TempDir* tmp_;
};

// The committed checkpoints of a job in an embedded store.
class Store {
 public:
  explicit Store(const std::string& dir);
  std::map<int64_t, client::CheckpointInfo> List(const std::string& job);
  std::string Tensor(const std::string& job, int64_t step, int rank, const std::string& name);
  // params | adam_m | adam_v of a FULL shard.
  std::string State(const std::string& job, int64_t step, int rank = 0);

 private:
  std::unique_ptr<client::Client> client_;
};

// Compares every checkpoint of `job` in `got` with the reference job `ref_job` (a FULL after
// every step) in `ref`, for ranks 0..nproc-1: a FULL must equal the reference's state of its step
// byte for byte; a DELTA, replayed with its predecessors over its base FULL, must too. Returns
// the number of FULL and DELTA checkpoints checked (failures are reported through gtest).
struct Checked {
  int fulls = 0;
  int deltas = 0;
};
Checked ExpectEqualsReference(Store& got, const std::string& job, Store& ref,
                              const std::string& ref_job, int nproc, const std::string& what);
// The number of FULL checkpoints of `job` whose state differs from the reference's (no gtest
// failures: for tests that expect differences).
int CountDifferingFulls(Store& got, const std::string& job, Store& ref,
                        const std::string& ref_job, int nproc);

}  // namespace e2e
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_SNAPSHOT_E2E_UTIL_H_
