#include "tests/trainer/run_util.h"

#include <signal.h>
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

ServerProcess::~ServerProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status;
  waitpid(pid_, &status, 0);
  if (out_ != nullptr) fclose(out_);
}

void ServerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (out_ != nullptr) fclose(out_);
  out_ = nullptr;
}

bool ServerProcess::Start(const std::string& binary, const std::string& data_dir,
                          std::string* error, const std::string& listen,
                          const std::vector<std::string>& extra) {
  int fds[2];
  if (pipe(fds) != 0) {
    *error = "pipe failed";
    return false;
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<std::string> args = {binary, "--data-dir", data_dir, "--listen", listen};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  FILE* out = fdopen(fds[0], "r");
  char line[512];
  const std::string prefix = "gradsnap-server listening on ";
  // Bounded: the server prints its line once ready, or exits (EOF).
  while (out != nullptr && fgets(line, sizeof(line), out) != nullptr) {
    std::string l(line);
    if (l.rfind(prefix, 0) == 0) {
      address_ = l.substr(prefix.size());
      while (!address_.empty() && (address_.back() == '\n' || address_.back() == '\r')) {
        address_.pop_back();
      }
      out_ = out;  // kept open: later stdout writes of the server must not hit SIGPIPE
      return true;
    }
  }
  if (out != nullptr) fclose(out);
  *error = "gradsnap-server exited before listening";
  return false;
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
