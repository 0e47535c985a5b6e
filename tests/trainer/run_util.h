// Helpers for the trainer's end-to-end tests: run a command, parse gradsnap-train's output.
#ifndef GRADSNAP_TESTS_TRAINER_RUN_UTIL_H_
#define GRADSNAP_TESTS_TRAINER_RUN_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace gradsnap {
namespace testing {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal or could not run
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` through /bin/sh with stderr folded into stdout.
RunResult RunCommand(const std::string& command);

// "step S loss L ..." lines: step -> loss text (exact, as printed).
std::map<int64_t, std::string> ParseLosses(const std::string& output);
// The value of `key=` in the summary line, or "" if absent.
std::string SummaryField(const std::string& output, const std::string& key);

// A gradsnap-server child process on 127.0.0.1 with a free port; SIGTERMed on destruction.
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess();
  // Starts `binary --data-dir data_dir --listen 127.0.0.1:0` and waits for its
  // "gradsnap-server listening on HOST:PORT" line. Returns false (with `error`) on failure.
  // `listen` (default a free port) and `extra` flags let a drill restart a killed server on the
  // same address.
  [[nodiscard]] bool Start(const std::string& binary, const std::string& data_dir, std::string* error,
                           const std::string& listen = "127.0.0.1:0",
                           const std::vector<std::string>& extra = {});
  // SIGKILLs the server and reaps it (no-op when not running).
  void Kill();
  const std::string& address() const { return address_; }

 private:
  int pid_ = -1;
  FILE* out_ = nullptr;  // the server's stdout
  std::string address_;
};

// A fresh, empty directory under the test temp dir.
std::string FreshDir(const std::string& name);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TRAINER_RUN_UTIL_H_
