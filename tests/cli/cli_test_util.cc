#include "tests/cli/cli_test_util.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/json.h"
#include "common/sha256.h"

namespace gradsnap {
namespace testing {

bool SafetensorsPayload(const std::string& file, std::string* payload) {
  const std::string blob = ::gradsnap::testing::ReadFileOrEmpty(file);
  if (blob.size() < 8) return false;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(blob[i])) << (8 * i);
  if (n > blob.size() - 8) return false;
  *payload = blob.substr(8 + n);
  return true;
}

std::string WriteExpectation(const client::testing::TestShard& shard, const std::string& job,
                             int64_t step, const std::string& path) {
  std::vector<std::string> tensors;
  for (const auto& t : shard.tensors) {
    tensors.push_back(absl::StrCat(
        "{\"name\":", JsonQuote(t.spec.name), ",\"dtype\":\"",
        DTypeSafetensorsName(t.spec.dtype), "\",\"shape\":[", absl::StrJoin(t.spec.shape, ","),
        "],\"sha256\":\"", Sha256Hex(t.data.data(), t.data.size()), "\"}"));
  }
  std::string json = absl::StrCat("{\"tensors\":[", absl::StrJoin(tensors, ","),
                                  "],\"metadata\":{\"job\":", JsonQuote(job),
                                  ",\"step\":\"", step, "\",\"rank\":\"", shard.rank, "\"}}");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << json;
  return path;
}

bool PythonParsesJson(const std::string& json) {
  const TempDir dir("json");
  const std::string path = dir.File("doc.json");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << json;
  const RunResult r =
      RunProgram("python3", {"-c", "import json,sys; json.load(open(sys.argv[1]))", path});
  return r.exit_code == 0;
}

}  // namespace testing
}  // namespace gradsnap
