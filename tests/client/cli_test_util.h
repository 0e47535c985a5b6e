// Helpers of the gradsnap CLI end-to-end tests: run build/bin/gradsnap as a subprocess, read
// safetensors payloads, write the expectations the independent Python reader checks.
#ifndef GRADSNAP_TESTS_CLIENT_CLI_TEST_UTIL_H_
#define GRADSNAP_TESTS_CLIENT_CLI_TEST_UTIL_H_

#include <string>
#include <vector>

#include "client/test_util.h"

namespace gradsnap {
namespace clitest {

struct RunResult {
  int rc = -1;
  std::string out;
  std::string err;
};

// Runs `program args...` with stdout and stderr captured (files in `scratch`).
RunResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                     const std::string& scratch);

// The data section of a safetensors file (after the header); false if malformed.
bool SafetensorsPayload(const std::string& file, std::string* payload);

// Writes the EXPECTED.json of read_safetensors.py for `shard` of checkpoint (job, step).
std::string WriteExpectation(const client::testing::TestShard& shard, const std::string& job,
                             int64_t step, const std::string& path);

// True when `json` parses as JSON according to python3's json module.
bool PythonParsesJson(const std::string& json, const std::string& scratch);

}  // namespace clitest
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_CLIENT_CLI_TEST_UTIL_H_
