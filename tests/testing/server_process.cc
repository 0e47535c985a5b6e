#include "tests/testing/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "tests/testing/process.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

constexpr char kReady[] = "gradsnap-server listening on ";

// Reads `fd` until a line starting with kReady arrived, the writer closed it, or 30 s passed.
// Returns everything read.
std::string ReadUntilReady(int fd) {
  std::string text;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < end) {
    const size_t at = text.rfind(kReady);
    if (at != std::string::npos && (at == 0 || text[at - 1] == '\n') &&
        text.find('\n', at) != std::string::npos) {
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

ServerProcess::ServerProcess(std::string binary) : binary_(std::move(binary)) {}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    Signal(SIGTERM);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int status = 0;
    pid_t r = 0;
    while ((r = ::waitpid(pid_, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (r == pid_) {
      pid_ = -1;
    } else {
      Kill();
    }
  }
  if (!log_path_.empty()) ::unlink(log_path_.c_str());
}

absl::Status ServerProcess::Start(const std::vector<std::string>& args) {
  args_ = args;
  return StartOnce(args_);
}

absl::Status ServerProcess::StartOn(const std::string& data_dir, const std::string& listen,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--data-dir", data_dir, "--listen", listen};
  args.insert(args.end(), extra.begin(), extra.end());
  return Start(args);
}

absl::Status ServerProcess::Restart(int attempts) {
  if (pid_ > 0) return absl::FailedPreconditionError("Restart: the server still runs");
  std::vector<std::string> args = args_;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--listen" && !address_.empty()) args[i + 1] = address_;
  }
  absl::Status st;
  for (int i = 0; i < attempts; ++i) {
    st = StartOnce(args);
    if (st.ok()) return st;
    Wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the port still held
  }
  return st;
}

absl::Status ServerProcess::StartOnce(const std::vector<std::string>& args) {
  if (pid_ > 0) return absl::FailedPreconditionError("Start: the server already runs");
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  if (log_path_.empty()) {
    std::string tmpl = "/tmp/gradsnap-server-log-XXXXXX";
    const char* base = std::getenv("TMPDIR");
    if (base != nullptr && *base != '\0') tmpl = absl::StrCat(base, "/gradsnap-server-log-XXXXXX");
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) return PosixError("mkstemp " + tmpl, errno);
    ::close(fd);
    log_path_ = tmpl;
  }
  const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (log_fd < 0) return PosixError("open " + log_path_, errno);
  std::vector<std::string> all = wrap_;
  all.push_back(binary_);
  all.insert(all.end(), args.begin(), args.end());
  const pid_t pid = SpawnChild(all, out[1], log_fd);
  const int spawn_errno = errno;
  ::close(out[1]);
  ::close(log_fd);
  if (pid < 0) {
    ::close(out[0]);
    return PosixError("start " + binary_, spawn_errno);
  }
  pid_ = pid;
  ready_ = false;
  const std::string text = ReadUntilReady(out[0]);
  ::close(out[0]);  // the server ignores SIGPIPE and prints nothing more on stdout
  const size_t at = text.rfind(kReady);
  const size_t eol = at == std::string::npos ? at : text.find('\n', at);
  if (eol == std::string::npos || (at != 0 && text[at - 1] != '\n')) {
    // Not ready. A child still running is killed (one that exited is a zombie until reaped, and
    // the signal does nothing to it); Wait() then tells how it ended.
    Signal(SIGKILL);
    return absl::UnavailableError(
        absl::StrCat("gradsnap-server did not get ready; stdout \"", text, "\"; log:\n", Log()));
  }
  ready_line_ = text.substr(at, eol - at);
  // HOST:PORT, then (a node refusing writes) a note after a space.
  address_ = text.substr(at + sizeof(kReady) - 1, eol - at - (sizeof(kReady) - 1));
  address_ = address_.substr(0, address_.find(' '));
  if (!absl::SimpleAtoi(address_.substr(address_.rfind(':') + 1), &port_)) {
    return absl::InternalError("bad readiness line: " + text.substr(at));
  }
  ready_ = true;
  return absl::OkStatus();
}

void ServerProcess::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int ServerProcess::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return ExitCodeOf(status);
}

void ServerProcess::Kill() {
  Signal(SIGKILL);
  Wait();
}

int ServerProcess::Stop() {
  Signal(SIGTERM);
  return Wait();
}

std::string ServerProcess::Describe() {
  if (pid_ <= 0) return "not running";
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == 0) return "running";
  pid_ = -1;
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return "gone";
}

uint64_t ServerProcess::RssBytes() const {
  std::istringstream in(ReadFileOrEmpty(absl::StrCat("/proc/", pid_, "/status")));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::istringstream ss(line.substr(6));
    uint64_t kb = 0;
    ss >> kb;
    return kb * 1024;
  }
  return 0;
}

int ServerProcess::metrics_port() const {
  const std::string log = Log();
  const std::string key = "metrics on port ";
  const size_t at = log.rfind(key);
  if (at == std::string::npos) return 0;
  return std::atoi(log.c_str() + at + key.size());
}

std::string ServerProcess::Log() const {
  return log_path_.empty() ? "" : ReadFileOrEmpty(log_path_);
}

}  // namespace testing
}  // namespace gradsnap
