#include "service/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace gradsnap {
namespace service {

ServiceMetrics* ServiceMetrics::Get() {
  static ServiceMetrics* m = [] {
    auto* m = new ServiceMetrics;
    Registry* r = Registry::Global();
    m->bytes_in = r->GetCounter("gradsnap_bytes_in_total", "Shard payload bytes received");
    m->bytes_out = r->GetCounter("gradsnap_bytes_out_total", "Shard payload bytes sent");
    m->chunks_in = r->GetCounter("gradsnap_chunks_in_total", "Write messages received");
    m->chunks_out = r->GetCounter("gradsnap_chunks_out_total", "Read messages sent");
    m->shard_commits = r->GetCounter("gradsnap_shard_commits_total", "Shards committed");
    m->checkpoint_commits =
        r->GetCounter("gradsnap_checkpoint_commits_total", "Checkpoints committed");
    m->inflight_bytes =
        r->GetCounter("gradsnap_inflight_bytes", "Upload bytes reserved in memory", true);
    m->busy_rejections = r->GetCounter("gradsnap_busy_rejections_total",
                                       "Uploads refused with RESOURCE_EXHAUSTED (server busy)");
    m->write_seconds = r->GetHistogram("gradsnap_write_seconds", "Write stream duration");
    m->read_seconds = r->GetHistogram("gradsnap_read_seconds", "Read stream duration");
    m->unary_seconds = r->GetHistogram("gradsnap_unary_seconds", "Unary call duration");
    m->write_refused_low_space = r->GetCounter(
        "gradsnap_storage_write_refused_low_space",
        "1 while writes are refused for want of space (below the catalog's reserve)", true);
    m->storage_free_bytes = r->GetCounter(
        "gradsnap_storage_free_bytes", "Free bytes on the data directory's file system", true);
    for (int c = 0; c <= 16; ++c) {
      std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
      m->errors_[c] = r->GetCounter(absl::StrCat("gradsnap_errors_total{code=\"", name, "\"}"),
                                    "Failed calls by status code");
    }
    return m;
  }();
  return m;
}

void ServiceMetrics::Error(int code) {
  if (code > 0 && code <= 16) errors_[code]->Add();
}

void ServiceMetrics::SetWriteSpace(const storage::WriteSpaceState& space) {
  write_refused_low_space->Set(space.writes_refused ? 1 : 0);
  storage_free_bytes->Set(static_cast<int64_t>(
      std::min<uint64_t>(space.free_bytes, static_cast<uint64_t>(INT64_MAX))));
}

absl::Status SplitHostPort(const std::string& host_port, std::string* host, int* port) {
  size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("expected HOST:PORT, got \"", host_port, "\""));
  }
  *host = host_port.substr(0, colon);
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in \"", host_port, "\""));
  }
  return absl::OkStatus();
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::Status MetricsHttpServer::Start(const std::string& host_port,
                                      std::function<void()> refresh) {
  refresh_ = std::move(refresh);
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(SplitHostPort(host_port, &host, &port));
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics host must be IPv4: ", host));
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("socket", errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    close(fd);
    return PosixError(absl::StrCat("bind/listen ", host_port), e);
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  listen_fd_ = fd;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsHttpServer::Loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void MetricsHttpServer::Serve(int fd) {
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  // Read the request head (bounded: 8 KiB, 2 s); its content does not matter.
  char buf[8192];
  size_t got = 0;
  for (int i = 0; i < 20 && got < sizeof(buf); ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = read(fd, buf + got, sizeof(buf) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
    if (absl::string_view(buf, got).find("\r\n\r\n") != absl::string_view::npos ||
        absl::string_view(buf, got).find("\n\n") != absl::string_view::npos) {
      break;
    }
  }
  if (refresh_) refresh_();
  std::string body = Registry::Global()->RenderPrometheus();
  std::string out = absl::StrCat(
      "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ",
      body.size(), "\r\nConnection: close\r\n\r\n", body);
  size_t off = 0;
  while (off < out.size()) {
    ssize_t n = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

}  // namespace service
}  // namespace gradsnap
