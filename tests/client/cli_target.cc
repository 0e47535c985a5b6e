#include "tests/client/cli_target.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace clitest {
namespace {

class EmbeddedTarget : public CliTarget {
 public:
  explicit EmbeddedTarget(std::string dir) : dir_(std::move(dir)) {}
  std::vector<std::string> Flags() const override { return {"--ckpt-dir", dir_}; }
  std::unique_ptr<client::Client> OpenClient(const std::string&) const override {
    client::ClientOptions o;
    o.local_dir = dir_;
    auto c = client::Client::Connect(o);
    if (!c.ok()) ADD_FAILURE() << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

 private:
  std::string dir_;
};

// A gradsnap-server child process on 127.0.0.1 with a free port; SIGTERM on destruction.
class ServerTarget : public CliTarget {
 public:
  ~ServerTarget() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  absl::Status Start(const std::string& scratch, const std::vector<std::string>& extra) {
    std::string data = scratch + "/server-data";
    std::filesystem::create_directories(data);
    std::string log = scratch + "/server.log";
    int pipefd[2];
    if (::pipe(pipefd) != 0) return absl::InternalError("pipe");
    pid_ = ::fork();
    if (pid_ < 0) return absl::InternalError("fork");
    if (pid_ == 0) {
      ::dup2(pipefd[1], STDOUT_FILENO);
      int errfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (errfd >= 0) ::dup2(errfd, STDERR_FILENO);
      ::close(pipefd[0]);
      std::vector<std::string> args = {GRADSNAP_SERVER_PATH, "--data-dir", data, "--listen",
                                       "127.0.0.1:0"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(GRADSNAP_SERVER_PATH, argv.data());
      ::_exit(127);
    }
    ::close(pipefd[1]);
    // Reads stdout until the readiness line (bounded by the server exiting and closing it).
    std::string text;
    char buf[256];
    const std::string kReady = "gradsnap-server listening on ";
    for (;;) {
      ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
      size_t at = text.find(kReady);
      size_t eol = at == std::string::npos ? at : text.find('\n', at);
      if (eol != std::string::npos) {
        address_ = text.substr(at + kReady.size(), eol - at - kReady.size());
        break;
      }
    }
    ::close(pipefd[0]);  // the server ignores SIGPIPE or prints nothing more on stdout
    if (address_.empty()) return absl::InternalError("gradsnap-server did not become ready: " + text);
    return absl::OkStatus();
  }

  std::vector<std::string> Flags() const override { return {"--server", address_}; }
  std::unique_ptr<client::Client> OpenClient(const std::string& token) const override {
    client::ClientOptions o;
    o.endpoints = {address_};
    o.token = token;
    auto c = client::Client::Connect(o);
    if (!c.ok()) ADD_FAILURE() << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace

std::vector<std::string> CliTargetNames() { return {"embedded", "server"}; }

absl::StatusOr<std::unique_ptr<CliTarget>> MakeTarget(
    const std::string& name, const std::string& scratch,
    const std::vector<std::string>& server_args) {
  if (name == "embedded") {
    std::string dir = scratch + "/ckpt";
    std::filesystem::create_directories(dir);
    return std::unique_ptr<CliTarget>(new EmbeddedTarget(dir));
  }
  if (name == "server") {
    auto t = std::make_unique<ServerTarget>();
    absl::Status st = t->Start(scratch, server_args);
    if (!st.ok()) return st;
    return std::unique_ptr<CliTarget>(std::move(t));
  }
  return absl::InvalidArgumentError("no CLI test target " + name);
}

}  // namespace clitest
}  // namespace gradsnap
