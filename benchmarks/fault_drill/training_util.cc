#include "benchmarks/fault_drill/training_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace drill {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, int out_fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  dup2(out_fd, STDOUT_FILENO);
  dup2(out_fd, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

int Decode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

Child::~Child() {
  if (pid_ > 0 && status_ < 0) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

absl::Status Child::Start(const std::vector<std::string>& argv, const std::string& log) {
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", log));
  pid_ = Spawn(argv, fd);
  close(fd);
  if (pid_ < 0) return absl::InternalError("fork failed");
  status_ = -1;
  return absl::OkStatus();
}

int Child::Poll() {
  if (pid_ <= 0 || status_ >= 0) return status_;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) status_ = Decode(st);
  return status_;
}

int Child::Wait() {
  if (pid_ <= 0 || status_ >= 0) return status_;
  int st = 0;
  while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  status_ = Decode(st);
  return status_;
}

void Child::Signal(int sig) {
  if (pid_ > 0 && status_ < 0) kill(pid_, sig);
}

Server::Server(std::string binary, std::string data_dir, std::vector<std::string> extra)
    : binary_(std::move(binary)), data_dir_(std::move(data_dir)), extra_(std::move(extra)) {}

Server::~Server() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int st;
    waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

absl::Status Server::Start() {
  if (address_.empty()) {
    absl::StatusOr<int> port = FreePort();
    if (!port.ok()) return port.status();
    address_ = absl::StrCat("127.0.0.1:", *port);
  }
  for (int attempt = 0; attempt < 50; ++attempt) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
    std::vector<std::string> argv = {binary_, "--data-dir", data_dir_, "--listen", address_};
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    // Bounded: the server prints its line when ready, or exits (EOF).
    std::string got;
    char c;
    while (got.find('\n') == std::string::npos && read(fds[0], &c, 1) == 1) got.push_back(c);
    if (got.rfind("gradsnap-server listening on ", 0) == 0) {
      pid_ = pid;
      out_fd_ = fds[0];  // kept open: the server's later stdout writes must not hit SIGPIPE
      return absl::OkStatus();
    }
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // port still held
  }
  return absl::UnavailableError(absl::StrCat("gradsnap-server did not start on ", address_));
}

void Server::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int st;
  waitpid(pid_, &st, 0);
  pid_ = -1;
  close(out_fd_);
  out_fd_ = -1;
}

absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return absl::InternalError("bind");
  }
  close(fd);
  return ntohs(a.sin_port);
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string SummaryField(const std::string& output, const std::string& key) {
  const size_t line = output.rfind("\nsummary ");
  if (line == std::string::npos) return "";
  const size_t at = output.find(" " + key + "=", line);
  const size_t eol = output.find('\n', line + 1);
  if (at == std::string::npos || at > eol) return "";
  const size_t begin = at + key.size() + 2;
  return output.substr(begin, output.find_first_of(" \n", begin) - begin);
}

int CountLines(const std::string& output, const std::string& prefix) {
  std::istringstream in(output);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0 ? 1 : 0;
  return n;
}

absl::StatusOr<StoreReport> CheckStore(client::Client& c, const std::string& job) {
  absl::StatusOr<std::vector<client::CheckpointInfo>> list = c.List(job);
  if (!list.ok()) return list.status();
  StoreReport r;
  std::map<int64_t, client::CheckpointInfo> by_step;
  for (const client::CheckpointInfo& i : *list) by_step[i.step] = i;
  for (const auto& [step, info] : by_step) {
    ++r.listed;
    const bool full = info.kind == client::CheckpointKind::kFull;
    (full ? r.fulls : r.deltas) += 1;
    absl::StatusOr<client::Manifest> m = c.Show(job, step);
    int committed_shards = 0;
    if (m.ok()) {
      for (const client::ShardInfo& s : m->shards) committed_shards += s.committed ? 1 : 0;
    }
    if (committed_shards < info.world_size) ++r.partial_listed;
    absl::Status v = c.Verify(job, step);
    if (absl::IsDataLoss(v)) {
      ++r.lost_data;
    } else if (!v.ok()) {
      ++r.verify_errors;
    }
    if (full) continue;
    auto base = by_step.find(info.base_step);
    if (base == by_step.end() || base->second.kind != client::CheckpointKind::kFull) {
      ++r.orphan_deltas_listed;
      continue;
    }
    if (step - 1 != info.base_step) {
      auto prev = by_step.find(step - 1);
      if (prev == by_step.end() || prev->second.kind != client::CheckpointKind::kDelta ||
          prev->second.base_step != info.base_step) {
        ++r.chain_holes_listed;
      }
    }
  }
  return r;
}

}  // namespace drill
}  // namespace gradsnap
