#include "benchmarks/fault_drill/drill_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace gradsnap {
namespace drill {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int StatusOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::vector<char*> Argv(std::vector<std::string>* all) {
  std::vector<char*> argv;
  for (auto& a : *all) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

}  // namespace

TempTree::TempTree(const std::string& parent, const std::string& tag, bool keep) : keep_(keep) {
  std::string tmpl = absl::StrCat(parent, "/gradsnap-drill-", tag, "-XXXXXX");
  path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
}

TempTree::~TempTree() {
  std::error_code ec;
  if (!keep_ && !path_.empty()) std::filesystem::remove_all(path_, ec);
}

ServerProc::~ServerProc() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    Wait();
  }
  if (!log_path_.empty()) ::unlink(log_path_.c_str());
}

absl::Status ServerProc::Start(const std::string& bin, const std::vector<std::string>& args) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  if (log_path_.empty()) {
    char tmpl[] = "/tmp/gradsnap-drill-log-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd < 0) return PosixError("mkstemp", errno);
    ::close(fd);
    log_path_ = tmpl;
  }
  int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  std::vector<std::string> all = {bin};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv = Argv(&all);
  pid_t pid = ::fork();
  if (pid < 0) return PosixError("fork", errno);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(log_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(log_fd);
  pid_ = pid;
  std::string line;
  auto start = std::chrono::steady_clock::now();
  while (line.find('\n') == std::string::npos &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  const std::string prefix = "gradsnap-server listening on ";
  if (line.rfind(prefix, 0) != 0 || line.find('\n') == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("server did not start: ", Log()));
  }
  address_ = line.substr(prefix.size(), line.find('\n') - prefix.size());
  if (!absl::SimpleAtoi(address_.substr(address_.rfind(':') + 1), &port_)) {
    return absl::InternalError("bad readiness line " + line);
  }
  return absl::OkStatus();
}

void ServerProc::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int ServerProc::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return StatusOf(status);
}

std::string ServerProc::Log() const { return log_path_.empty() ? "" : Slurp(log_path_); }

ExitResult RunToExit(const std::string& bin, const std::vector<std::string>& args,
                     int timeout_s) {
  ExitResult r;
  char out_tmpl[] = "/tmp/gradsnap-drill-out-XXXXXX";
  char err_tmpl[] = "/tmp/gradsnap-drill-err-XXXXXX";
  int out_fd = ::mkstemp(out_tmpl);
  int err_fd = ::mkstemp(err_tmpl);
  if (out_fd < 0 || err_fd < 0) return r;
  std::vector<std::string> all = {bin};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv = Argv(&all);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_fd);
  ::close(err_fd);
  int status = 0;
  auto start = std::chrono::steady_clock::now();
  while (pid > 0 && ::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(timeout_s)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.code = pid > 0 ? StatusOf(status) : -1;
  r.out = Slurp(out_tmpl);
  r.err = Slurp(err_tmpl);
  ::unlink(out_tmpl);
  ::unlink(err_tmpl);
  return r;
}

int CountFiles(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file(ec)) ++n;
  }
  return n;
}

std::string FormatKv(const std::map<std::string, std::string>& kv) {
  std::string out;
  for (const auto& [k, v] : kv) absl::StrAppend(&out, out.empty() ? "" : " ", k, "=", v);
  return out;
}

}  // namespace drill
}  // namespace gradsnap
