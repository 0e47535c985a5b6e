// Child processes of the tests and drills: a command run to its exit with its output captured,
// and a process running in the background with its output in a log file.
//
// Exit codes read as a shell's: the exit status (0..255), 128 + the signal that ended the
// process, -1 when it could not be started. Not thread-safe per object.
#ifndef GRADSNAP_TESTS_TESTING_PROCESS_H_
#define GRADSNAP_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace gradsnap {
namespace testing {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout (RunCommand: stdout and stderr, interleaved)
  std::string err;  // stderr (RunCommand: empty)
};

// Runs `program` (a path, or a name looked up in $PATH) with `args`, stdin /dev/null, stdout
// and stderr captured apart; SIGKILLed after `timeout_s` seconds when that is > 0.
RunResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                     int timeout_s = 0);
// Runs `command` through /bin/sh with stderr folded into stdout.
RunResult RunCommand(const std::string& command, int timeout_s = 0);

// The exit code (as above) of a waitpid status.
int ExitCodeOf(int wait_status);

// Starts argv[0] (a path, or a name looked up in $PATH) with stdin from /dev/null, stdout on
// out_fd and stderr on err_fd. With posix_spawn, not fork(): a parent holding gigabytes (the
// benchmarks) neither waits for its page tables to be copied nor takes a copy-on-write fault
// on every page it writes afterwards. Returns the pid, or -1 with errno set when the program
// could not be started.
pid_t SpawnChild(const std::vector<std::string>& argv, int out_fd, int err_fd);

// A process in the background, stdout and stderr appended to a log file. The destructor
// SIGKILLs and reaps it if it still runs.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts argv[0] (a path, or a name looked up in $PATH) with argv; `log` is truncated first,
  // or, with `append`, written on after what it holds (O_APPEND: a restarted process's log).
  absl::Status Start(const std::vector<std::string>& argv, const std::string& log,
                     bool append = false);
  // The exit code, or -1 while it still runs (reaps it once ended).
  int Poll();
  // Waits for the exit and returns its code.
  int Wait();
  void Signal(int sig);
  // SIGKILL, then Wait().
  int Kill();
  bool running() { return Poll() < 0 && pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  // The log so far.
  std::string Output() const;

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::string log_;
};

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_PROCESS_H_
