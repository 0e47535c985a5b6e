#include "tests/service/service_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/status.h"

#ifndef GRADSNAP_SERVER_BIN
#error "GRADSNAP_SERVER_BIN must name the gradsnap-server binary"
#endif

namespace gradsnap {
namespace testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base ? base : "/tmp", "/gradsnap-svc-XXXXXX");
  char* made = mkdtemp(tmpl.data());
  path_ = made ? made : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

absl::Status ServerProcess::Start(const std::vector<std::string>& args) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  char tmpl[] = "/tmp/gradsnap-server-log-XXXXXX";
  int log_fd = mkstemp(tmpl);
  if (log_fd < 0) return PosixError("mkstemp", errno);
  log_path_ = tmpl;
  std::vector<std::string> argv_s = {GRADSNAP_SERVER_BIN};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return PosixError("fork", errno);
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(log_fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(log_fd);
  pid_ = pid;
  std::string line;
  Stopwatch watch;
  while (line.find('\n') == std::string::npos) {
    if (watch.ElapsedSeconds() > 30) break;
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[256];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  const std::string prefix = "gradsnap-server listening on ";
  if (line.rfind(prefix, 0) != 0 || line.find('\n') == std::string::npos) {
    return absl::InternalError(absl::StrCat("server did not get ready; stdout \"", line,
                                            "\"; log:\n", Log()));
  }
  address_ = line.substr(prefix.size(), line.find('\n') - prefix.size());
  std::string port = address_.substr(address_.rfind(':') + 1);
  if (!absl::SimpleAtoi(port, &port_)) return absl::InternalError("bad readiness line " + line);
  return absl::OkStatus();
}

void ServerProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int ServerProcess::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string ServerProcess::Describe() {
  if (pid_ <= 0) return "not running";
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return "running";
  pid_ = -1;
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return "gone";
}

uint64_t ServerProcess::RssBytes() const {
  std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream ss(line.substr(6));
      uint64_t kb = 0;
      ss >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

int ServerProcess::metrics_port() const {
  std::string log = Log();
  const std::string key = "metrics on port ";
  size_t at = log.find(key);
  if (at == std::string::npos) return 0;
  return std::atoi(log.c_str() + at + key.size());
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> HttpGet(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    return PosixError("connect", e);
  }
  const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) < 0) {
    close(fd);
    return absl::UnavailableError("send");
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.0 200", 0) != 0 || body == std::string::npos) {
    return absl::InternalError("bad HTTP response: " + resp.substr(0, 100));
  }
  return resp.substr(body + 4);
}

double MetricValue(const std::string& body, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.size() > name.size() && line.substr(0, name.size()) == name &&
        line[name.size()] == ' ') {
      double v = 0;
      if (absl::SimpleAtod(line.substr(name.size() + 1), &v)) return v;
    }
  }
  return -1;
}

absl::Status MakeTlsMaterial(const std::string& dir) {
  std::string d = dir;
  std::string script = absl::StrCat(
      "set -e; cd '", d, "';",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=gradsnap-test-ca "
      "-keyout ca.key -out ca.pem;",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
      "-keyout other-ca.key -out other-ca.pem;",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext;",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key "
      "-out server.csr;",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile san.ext -out server.pem;",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=trainer -keyout client.key "
      "-out client.csr;",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out client.pem", ") >/dev/null 2>&1");
  script = "(" + script;
  if (std::system(script.c_str()) != 0) return absl::InternalError("openssl failed");
  return absl::OkStatus();
}

std::vector<client::TensorRef> TestShard::Refs() const {
  std::vector<client::TensorRef> refs;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    refs.push_back(client::TensorRef{spec.tensors[i], data[i].data()});
  }
  return refs;
}

std::string TestShard::Payload() const {
  std::string all;
  for (const auto& d : data) all += d;
  return all;
}

TestShard MakeShard(const std::string& job, int64_t step, int32_t rank,
                    const std::vector<uint64_t>& tensor_bytes, uint64_t seed) {
  TestShard s;
  s.spec.job = job;
  s.spec.step = step;
  s.spec.rank = rank;
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(rank));
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    uint64_t n = tensor_bytes[i] / 4 * 4;
    storage::TensorSpec t;
    t.name = absl::StrCat("layer", i, ".weight");
    t.dtype = DType::kF32;
    t.shape = {static_cast<int64_t>(n / 4)};
    t.byte_length = n;
    std::string bytes(n, '\0');
    for (uint64_t k = 0; k + 8 <= n; k += 8) {
      uint64_t v = rng();
      std::memcpy(bytes.data() + k, &v, 8);
    }
    s.spec.tensors.push_back(t);
    s.data.push_back(std::move(bytes));
  }
  return s;
}

client::CheckpointSpec FullSpec(const std::string& job, int64_t step, int32_t world_size) {
  client::CheckpointSpec c;
  c.job = job;
  c.step = step;
  c.kind = client::CheckpointKind::kFull;
  c.base_step = -1;
  c.world_size = world_size;
  return c;
}

absl::StatusOr<std::string> RestoreToString(client::Client* c, const std::string& job,
                                            int64_t step, int32_t rank) {
  std::string out;
  RETURN_IF_ERROR(c->RestoreShard(job, step, rank, [&](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace testing
}  // namespace gradsnap
