// Helpers of the gradsnap CLI end-to-end tests: read safetensors payloads, write the
// expectations the independent Python reader checks. Processes and temporary directories come
// from tests/testing/.
#ifndef GRADSNAP_TESTS_CLI_CLI_TEST_UTIL_H_
#define GRADSNAP_TESTS_CLI_CLI_TEST_UTIL_H_

#include <string>
#include <vector>

#include "client/test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {

// The data section of a safetensors file (after the header); false if malformed.
bool SafetensorsPayload(const std::string& file, std::string* payload);

// Writes the EXPECTED.json of read_safetensors.py for `shard` of checkpoint (job, step).
std::string WriteExpectation(const client::testing::TestShard& shard, const std::string& job,
                             int64_t step, const std::string& path);

// True when `json` parses as JSON according to python3's json module.
bool PythonParsesJson(const std::string& json);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_CLI_CLI_TEST_UTIL_H_
