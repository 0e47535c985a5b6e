// NetNamespace, Bridge (netns.h).
#include "tests/testing/netns.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "tests/testing/process.h"

namespace gradsnap {
namespace testing {

absl::Status Ip(const std::vector<std::string>& args) {
  RunResult r = RunProgram("ip", args, /*timeout_s=*/30);
  if (r.exit_code == 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("ip ", absl::StrJoin(args, " "), ": ",
                                             absl::StripAsciiWhitespace(r.err + r.out),
                                             " (exit ", r.exit_code, ")"));
}

std::string NetnsUnavailable() {
  if (::geteuid() != 0) return "network namespaces need root (this test runs unprivileged)";
  const std::string name = absl::StrCat("gsprobe", ::getpid());
  absl::Status made = Ip({"netns", "add", name});
  if (!made.ok()) return std::string(made.message());
  const std::string a = absl::StrCat("gsp", ::getpid() % 100000, "a");
  const std::string b = absl::StrCat("gsp", ::getpid() % 100000, "b");
  absl::Status veth = Ip({"link", "add", a, "type", "veth", "peer", "name", b});
  if (veth.ok()) Ip({"link", "del", a}).IgnoreError();
  Ip({"netns", "del", name}).IgnoreError();
  return veth.ok() ? "" : std::string(veth.message());
}

int PrivateNet() { return 100 + static_cast<int>(::getpid() % 120); }

absl::StatusOr<std::unique_ptr<NetNamespace>> NetNamespace::Create(const std::string& name) {
  Ip({"netns", "del", name}).IgnoreError();  // left over by a killed run
  if (absl::Status s = Ip({"netns", "add", name}); !s.ok()) return s;
  std::unique_ptr<NetNamespace> ns(new NetNamespace(name));
  if (absl::Status s = Ip({"-n", name, "link", "set", "lo", "up"}); !s.ok()) return s;
  return ns;
}

NetNamespace::~NetNamespace() {
  for (const std::string& link : links_) Ip({"link", "del", link}).IgnoreError();
  Ip({"netns", "del", name_}).IgnoreError();
}

absl::Status NetNamespace::AddLink(const std::string& host_if, const std::string& host_cidr,
                                   const std::string& ns_cidr, const std::string& bridge) {
  const std::string peer = host_if + "p";  // inside the namespace after the move
  Ip({"link", "del", host_if}).IgnoreError();  // left over by a killed run
  if (absl::Status s = Ip({"link", "add", host_if, "type", "veth", "peer", "name", peer});
      !s.ok()) {
    return s;
  }
  links_.push_back(host_if);
  std::vector<std::vector<std::string>> steps = {{"link", "set", peer, "netns", name_}};
  if (!host_cidr.empty()) steps.push_back({"addr", "add", host_cidr, "dev", host_if});
  if (!bridge.empty()) steps.push_back({"link", "set", host_if, "master", bridge});
  steps.push_back({"link", "set", host_if, "up"});
  steps.push_back({"-n", name_, "addr", "add", ns_cidr, "dev", peer});
  steps.push_back({"-n", name_, "link", "set", peer, "up"});
  for (const auto& step : steps) {
    if (absl::Status s = Ip(step); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NetNamespace::SetLinkUp(const std::string& host_if, bool up) {
  return Ip({"link", "set", host_if, up ? "up" : "down"});
}

std::vector<std::string> NetNamespace::Wrap(const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"ip", "netns", "exec", name_};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::StatusOr<std::unique_ptr<Bridge>> Bridge::Create(const std::string& name,
                                                       const std::string& cidr) {
  Ip({"link", "del", name}).IgnoreError();  // left over by a killed run
  if (absl::Status s = Ip({"link", "add", "name", name, "type", "bridge"}); !s.ok()) return s;
  std::unique_ptr<Bridge> b(new Bridge(name));
  if (absl::Status s = Ip({"addr", "add", cidr, "dev", name}); !s.ok()) return s;
  if (absl::Status s = Ip({"link", "set", name, "up"}); !s.ok()) return s;
  return b;
}

Bridge::~Bridge() { Ip({"link", "del", name_}).IgnoreError(); }

}  // namespace testing
}  // namespace gradsnap
