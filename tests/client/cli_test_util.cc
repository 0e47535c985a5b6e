#include "tests/client/cli_test_util.h"

#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/json.h"
#include "common/dtype.h"
#include "common/sha256.h"

namespace gradsnap {
namespace clitest {
namespace {

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out.push_back(c);
  }
  return out + "'";
}

}  // namespace

RunResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                     const std::string& scratch) {
  static std::atomic<int> counter{0};
  int id = counter++;
  std::string out = absl::StrCat(scratch, "/run", id, ".out");
  std::string err = absl::StrCat(scratch, "/run", id, ".err");
  std::string cmd = ShellQuote(program);
  for (const std::string& a : args) absl::StrAppend(&cmd, " ", ShellQuote(a));
  absl::StrAppend(&cmd, " >", ShellQuote(out), " 2>", ShellQuote(err), " </dev/null");
  RunResult r;
  int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  client::testing::ReadFile(out, &r.out);
  client::testing::ReadFile(err, &r.err);
  return r;
}

bool SafetensorsPayload(const std::string& file, std::string* payload) {
  std::string blob;
  if (!client::testing::ReadFile(file, &blob) || blob.size() < 8) return false;
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
        "{\"name\":", client::JsonQuote(t.spec.name), ",\"dtype\":\"",
        DTypeSafetensorsName(t.spec.dtype), "\",\"shape\":[", absl::StrJoin(t.spec.shape, ","),
        "],\"sha256\":\"", Sha256Hex(t.data.data(), t.data.size()), "\"}"));
  }
  std::string json = absl::StrCat("{\"tensors\":[", absl::StrJoin(tensors, ","),
                                  "],\"metadata\":{\"job\":", client::JsonQuote(job),
                                  ",\"step\":\"", step, "\",\"rank\":\"", shard.rank, "\"}}");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << json;
  return path;
}

bool PythonParsesJson(const std::string& json, const std::string& scratch) {
  static std::atomic<int> counter{0};
  std::string path = absl::StrCat(scratch, "/doc", counter++, ".json");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << json;
  RunResult r = RunProgram("python3", {"-c", "import json,sys; json.load(open(sys.argv[1]))", path},
                           scratch);
  return r.rc == 0;
}

}  // namespace clitest
}  // namespace gradsnap
