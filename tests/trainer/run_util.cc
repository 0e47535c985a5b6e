#include "tests/trainer/run_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "gtest/gtest.h"

namespace gradsnap {
namespace testing {

RunResult RunCommand(const std::string& command) {
  RunResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

std::map<int64_t, std::string> ParseLosses(const std::string& output) {
  std::map<int64_t, std::string> losses;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string w1, w3, loss;
    int64_t step;
    if (ls >> w1 >> step >> w3 >> loss && w1 == "step" && w3 == "loss") losses[step] = loss;
  }
  return losses;
}

std::string SummaryField(const std::string& output, const std::string& key) {
  const size_t line = output.rfind("summary ");
  if (line == std::string::npos) return "";
  const size_t at = output.find(" " + key + "=", line);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 2;
  const size_t end = output.find_first_of(" \n", begin);
  return output.substr(begin, end - begin);
}

std::string FreshDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/gs_trainer_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace testing
}  // namespace gradsnap
