#include "tests/testing/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "common/status.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

// Reaps `pid`, SIGKILLing it first once `timeout_s` (> 0) has passed.
int Reap(pid_t pid, int timeout_s) {
  int status = 0;
  if (timeout_s <= 0) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return ExitCodeOf(status);
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return ExitCodeOf(status);
}

}  // namespace

pid_t SpawnChild(const std::vector<std::string>& argv, int out_fd, int err_fd) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    errno = err;
    return -1;
  }
  return pid;
}

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

RunResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                     int timeout_s) {
  std::vector<std::string> argv = {program};
  argv.insert(argv.end(), args.begin(), args.end());
  RunResult r;
  TempDir dir("run");
  const std::string out = dir.File("out"), err = dir.File("err");
  const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const pid_t pid = out_fd >= 0 && err_fd >= 0 ? SpawnChild(argv, out_fd, err_fd) : -1;
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  if (pid < 0) return r;
  r.exit_code = Reap(pid, timeout_s);
  r.out = ReadFileOrEmpty(out);
  r.err = ReadFileOrEmpty(err);
  return r;
}

RunResult RunCommand(const std::string& command, int timeout_s) {
  RunResult r = RunProgram("/bin/sh", {"-c", command + " 2>&1"}, timeout_s);
  r.out += r.err;  // empty unless the shell itself complained
  r.err.clear();
  return r;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && exit_code_ < 0) Kill();
}

absl::Status ChildProcess::Start(const std::vector<std::string>& argv, const std::string& log,
                                 bool append) {
  if (argv.empty()) return absl::InvalidArgumentError("ChildProcess::Start: empty argv");
  const int fd = ::open(log.c_str(),
                        O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return PosixError("open " + log, errno);
  pid_ = SpawnChild(argv, fd, fd);
  const int fork_errno = errno;
  ::close(fd);
  if (pid_ < 0) return PosixError("start " + argv[0], fork_errno);
  log_ = log;
  exit_code_ = -1;
  return absl::OkStatus();
}

int ChildProcess::Poll() {
  if (pid_ <= 0 || exit_code_ >= 0) return exit_code_;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) exit_code_ = ExitCodeOf(status);
  return exit_code_;
}

int ChildProcess::Wait() {
  if (pid_ <= 0 || exit_code_ >= 0) return exit_code_;
  exit_code_ = Reap(pid_, 0);
  return exit_code_;
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0 && exit_code_ < 0) ::kill(pid_, sig);
}

int ChildProcess::Kill() {
  Signal(SIGKILL);
  return Wait();
}

std::string ChildProcess::Output() const { return ReadFileOrEmpty(log_); }

}  // namespace testing
}  // namespace gradsnap
