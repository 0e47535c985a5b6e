// EtcdCluster (etcd_cluster.h).
#include "tests/testing/etcd_cluster.h"

#include <signal.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {

EtcdCluster::EtcdCluster(std::string dir) : dir_(std::move(dir)) {}

absl::Status EtcdCluster::Start(int members, const std::vector<Place>& places) {
  if (members < 1 || !members_.empty() ||
      (!places.empty() && places.size() != static_cast<size_t>(members))) {
    return absl::InvalidArgumentError(
        "EtcdCluster::Start: once, with >= 1 member (and a place for each, if any)");
  }
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    Member m;
    m.name = absl::StrCat("m", i);
    if (!places.empty()) m.place = places[i];
    if (m.place.hosts.empty()) return absl::InvalidArgumentError("a member needs a host");
    auto client = FreePort();
    if (!client.ok()) return client.status();
    auto peer = FreePort();
    if (!peer.ok()) return peer.status();
    m.client_port = *client;
    m.peer_port = *peer;
    if (m.client_port == m.peer_port) return absl::UnavailableError("port picked twice");
    peers.push_back(absl::StrCat(m.name, "=http://", m.place.hosts[0], ":", m.peer_port));
    members_.push_back(std::move(m));
  }
  initial_cluster_ = absl::StrJoin(peers, ",");
  for (int i = 0; i < members; ++i) {
    if (absl::Status s = StartMember(i); !s.ok()) return s;
  }
  for (int i = 0; i < members; ++i) {
    if (absl::Status s = WaitHealthy(i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string EtcdCluster::Endpoint(int i, int host_index) const {
  return absl::StrCat(members_[i].place.hosts.at(host_index), ":", members_[i].client_port);
}

std::string EtcdCluster::Endpoints(int host_index) const {
  std::vector<std::string> all;
  for (int i = 0; i < size(); ++i) all.push_back(Endpoint(i, host_index));
  return absl::StrJoin(all, ",");
}

absl::Status EtcdCluster::StartMember(int i) {
  Member& m = members_[i];
  std::vector<std::string> listen;
  const char* scheme = tls_.cert.empty() ? "http://" : "https://";
  for (const std::string& h : m.place.hosts) {
    listen.push_back(absl::StrCat(scheme, h, ":", m.client_port));
  }
  const std::string peer_url = absl::StrCat("http://", m.place.hosts[0], ":", m.peer_port);
  m.process = std::make_unique<ChildProcess>();
  std::vector<std::string> argv = m.place.wrap;
  const std::vector<std::string> etcd = {
       "etcd", "--name", m.name, "--data-dir", absl::StrCat(dir_, "/", m.name, ".etcd"),
       "--listen-client-urls", absl::StrJoin(listen, ","), "--advertise-client-urls", listen[0],
       "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
       "--initial-cluster", initial_cluster_, "--initial-cluster-state", "new",
       "--initial-cluster-token", "gradsnap-test", "--logger", "zap", "--log-outputs", "stderr"};
  argv.insert(argv.end(), etcd.begin(), etcd.end());
  if (!tls_.cert.empty()) {
    argv.insert(argv.end(), {"--cert-file", tls_.cert, "--key-file", tls_.key});
  }
  if (!tls_.client_ca.empty()) {
    argv.insert(argv.end(), {"--trusted-ca-file", tls_.client_ca, "--client-cert-auth"});
  }
  return m.process->Start(argv, absl::StrCat(dir_, "/", m.name, ".log"));
}

absl::Status EtcdCluster::WaitHealthy(int i) {
  std::string last;
  for (int attempt = 0; attempt < 300; ++attempt) {  // 300 x (call + 200 ms): about a minute
    if (!members_[i].process->running()) {
      return absl::UnavailableError(absl::StrCat("etcd member ", i, " exited: ", Log(i)));
    }
    RunResult r = Ctl(i, {"--command-timeout=2s", "endpoint", "health"});
    if (r.exit_code == 0) return absl::OkStatus();
    last = r.out + r.err;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd member ", i, " not healthy within a minute: ", last));
}

std::vector<std::string> EtcdCluster::CtlFlags(int i) const {
  std::vector<std::string> f = {"--endpoints", Endpoint(i)};
  if (!tls_.cert.empty()) {
    f = {"--endpoints", "https://" + Endpoint(i), "--cacert", tls_.ca};
    if (!tls_.client_cert.empty()) {
      f.insert(f.end(), {"--cert", tls_.client_cert, "--key", tls_.client_key});
    }
  }
  if (!ctl_user_.empty()) f.insert(f.end(), {"--user", ctl_user_});
  return f;
}

RunResult EtcdCluster::Ctl(int i, const std::vector<std::string>& args) const {
  std::vector<std::string> all = CtlFlags(i);
  all.insert(all.end(), args.begin(), args.end());
  return RunProgram("etcdctl", all, /*timeout_s=*/30);
}

int EtcdCluster::Leader() const {
  // `endpoint status -w json`: [{"Endpoint":..,"Status":{"header":{"member_id":M,..},
  // "leader":L,..}}]; the leader is the member whose own id is the leader id it reports.
  auto field = [](const std::string& text, const std::string& key) -> std::string {
    const size_t at = text.find("\"" + key + "\":");
    if (at == std::string::npos) return "";
    const size_t from = at + key.size() + 3;
    return text.substr(from, text.find_first_of(",}", from) - from);
  };
  for (int i = 0; i < size(); ++i) {
    if (members_[i].process == nullptr || !members_[i].process->running()) continue;
    const RunResult r = Ctl(i, {"endpoint", "status", "-w", "json"});
    if (r.exit_code != 0) continue;
    const std::string member = field(r.out, "member_id");
    if (!member.empty() && member == field(r.out, "leader")) return i;
  }
  return -1;
}

void EtcdCluster::Kill(int i) {
  if (members_[i].process) members_[i].process->Kill();
}

absl::Status EtcdCluster::Restart(int i, bool wait_healthy) {
  Kill(i);
  if (absl::Status s = StartMember(i); !s.ok()) return s;
  return wait_healthy ? WaitHealthy(i) : absl::OkStatus();
}

std::string EtcdCluster::Log(int i) const {
  return members_[i].process ? members_[i].process->Output() : "";
}

absl::StatusOr<std::string> StartClusterNode(ServerProcess* server, const std::string& data_dir,
                                             const std::string& etcd_endpoints,
                                             const std::vector<std::string>& extra) {
  absl::StatusOr<int> port = FreePort();
  if (!port.ok()) return port.status();
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  std::vector<std::string> flags = {"--etcd", etcd_endpoints, "--advertise", address};
  flags.insert(flags.end(), extra.begin(), extra.end());
  absl::Status s = server->StartOn(data_dir, address, flags);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(s.message(), ": ", server->Log()));
  return address;
}

}  // namespace testing
}  // namespace gradsnap
