// Simulated machines on this host for the cluster tests and the chaos drill: Linux network
// namespaces joined to the host by veth pairs, made and removed by the object that owns them.
// Every address is a private 10.x.y.z one on those veth links; nothing leaves the host.
//
// Making them needs root (CAP_NET_ADMIN / CAP_SYS_ADMIN) and iproute2's `ip`;
// NetnsUnavailable() says why not where they cannot be made, and the callers skip visibly.
//
// Not thread-safe per object.
#ifndef GRADSNAP_TESTS_TESTING_NETNS_H_
#define GRADSNAP_TESTS_TESTING_NETNS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsnap {
namespace testing {

// "" when network namespaces and veth pairs can be made here (one is made and removed to find
// out), else the reason, one line.
std::string NetnsUnavailable();

// A private /16 for one test or drill process, "10.A.B" style prefixes come from it: 10.N.0.0
// with N from 100..219 picked from the pid, so concurrent tests rarely share one.
int PrivateNet();

// One network namespace with its loopback up and any number of veth links to the host. The
// destructor removes the links and the namespace (its processes should be gone first: a
// process still inside keeps the namespace alive, unnamed, until it exits).
class NetNamespace {
 public:
  // Makes namespace `name` (an old one of that name is removed first), its `lo` up.
  static absl::StatusOr<std::unique_ptr<NetNamespace>> Create(const std::string& name);
  ~NetNamespace();
  NetNamespace(const NetNamespace&) = delete;
  NetNamespace& operator=(const NetNamespace&) = delete;

  // A veth pair: `host_if` on the host with `host_cidr` (e.g. "10.150.1.1/30"; empty: no
  // address, for a bridge port), its peer inside the namespace with `ns_cidr`; both up. With
  // `bridge` non-empty the host end is made a port of that bridge (Bridge below).
  absl::Status AddLink(const std::string& host_if, const std::string& host_cidr,
                       const std::string& ns_cidr, const std::string& bridge = "");
  // Takes the host end of a link down (the namespace is cut off on that link: its peers see
  // no answer, it gets "network unreachable") or up again.
  absl::Status SetLinkUp(const std::string& host_if, bool up);
  // `argv` run inside the namespace: {"ip", "netns", "exec", name, argv...}. `ip netns exec`
  // execs the program, so the pid that runs is the program's.
  std::vector<std::string> Wrap(const std::vector<std::string>& argv) const;
  const std::string& name() const { return name_; }

 private:
  explicit NetNamespace(std::string name) : name_(std::move(name)) {}
  const std::string name_;
  std::vector<std::string> links_;  // host ends
};

// A Linux bridge on the host with an address (e.g. "10.150.0.1/24"): every namespace whose
// link is a port of it reaches the host and each other. Removed by the destructor.
class Bridge {
 public:
  static absl::StatusOr<std::unique_ptr<Bridge>> Create(const std::string& name,
                                                        const std::string& cidr);
  ~Bridge();
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;
  const std::string& name() const { return name_; }

 private:
  explicit Bridge(std::string name) : name_(std::move(name)) {}
  const std::string name_;
};

// Runs `ip args...`; the error names the command and what `ip` said.
absl::Status Ip(const std::vector<std::string>& args);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_NETNS_H_
