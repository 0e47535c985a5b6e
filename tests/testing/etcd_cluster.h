// EtcdCluster: a real etcd of 1 or more members on loopback ports, in a directory of the test,
// for the cluster-mode tests (Debian's etcd-server; scripts/install-deps.sh installs it). Every
// member is an `etcd` child process with its data directory and log under `dir`.
//
// Waits are bounded: Start() waits up to 60 s for every member to answer `etcdctl endpoint
// health`. The destructor SIGKILLs the members that still run.
//
// Not thread-safe per object; each test owns its cluster.
#ifndef GRADSNAP_TESTS_TESTING_ETCD_CLUSTER_H_
#define GRADSNAP_TESTS_TESTING_ETCD_CLUSTER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"

namespace gradsnap {
namespace testing {

class EtcdCluster {
 public:
  // `dir`: an existing directory the cluster may fill (a TempDir's).
  // Not copyable (owns its member processes, which ChildProcess kills when it is destroyed).
  explicit EtcdCluster(std::string dir);

  // Where a member runs: the addresses its client port listens on (the first one also takes
  // its peer port and is the one it advertises) and a command prefix it runs under (a network
  // namespace's NetNamespace::Wrap; empty: none).
  struct Place {
    std::vector<std::string> hosts = {"127.0.0.1"};
    std::vector<std::string> wrap;
  };
  // Client TLS of every member (set before Start): etcd's --cert-file, --key-file, and with
  // client_ca --trusted-ca-file and --client-cert-auth (client certificates required). The
  // client URLs are then https:// (Endpoints() stays "H:P"); the health checks present
  // `client_cert`/`client_key` and trust `ca`.
  struct Tls {
    std::string ca, cert, key;           // the server side
    std::string client_ca;               // empty: no client certificates asked
    std::string client_cert, client_key;  // what the health checks present
  };
  void set_tls(Tls tls) { tls_ = std::move(tls); }
  // "USER:PASSWORD" the health checks and Ctl() use once etcd's authentication is on.
  void set_ctl_user(std::string user) { ctl_user_ = std::move(user); }

  // Starts `members` members (1 or 3, say) on free ports, member i at places[i] (default: on
  // loopback), and waits until each is healthy (a quorum has elected a leader).
  absl::Status Start(int members, const std::vector<Place>& places = {});
  // "H:P1,H:P2,..." (the --etcd value of every member), H each member's host `host_index`.
  std::string Endpoints(int host_index = 0) const;
  // "H:P" of member i (its host `host_index`).
  std::string Endpoint(int i, int host_index = 0) const;
  int size() const { return static_cast<int>(members_.size()); }

  // The index of the member that is the leader now (etcdctl endpoint status), -1 if none
  // answers that it is.
  int Leader() const;
  // SIGKILLs member i.
  void Kill(int i);
  // Starts member i again on its ports and data directory; waits until it is healthy when a
  // quorum is up (`wait_healthy`).
  absl::Status Restart(int i, bool wait_healthy = true);
  // Runs `etcdctl args...` against member i (TLS as set), 30 s at most.
  RunResult Ctl(int i, const std::vector<std::string>& args) const;
  // The log of member i so far.
  std::string Log(int i) const;

 private:
  struct Member {
    std::string name;
    Place place;
    int client_port = 0;
    int peer_port = 0;
    std::unique_ptr<ChildProcess> process;
  };
  absl::Status StartMember(int i);
  absl::Status WaitHealthy(int i);

  // etcdctl's flags to reach member i (TLS files included).
  std::vector<std::string> CtlFlags(int i) const;

  const std::string dir_;
  Tls tls_;
  std::string ctl_user_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

// Starts `server` (gradsnap-server) as a cluster node of `etcd_endpoints` on `data_dir`,
// listening on and advertising a free loopback port, with `extra` flags; returns its address.
absl::StatusOr<std::string> StartClusterNode(ServerProcess* server, const std::string& data_dir,
                                             const std::string& etcd_endpoints,
                                             const std::vector<std::string>& extra = {});

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_ETCD_CLUSTER_H_
