// The etcd security flags that gradsnap-server and gradsnap-train share (docs/protocol.md,
// "etcd security"): --etcd-ca, --etcd-cert, --etcd-key, --etcd-user, --etcd-password-file.
// Defined once here; a program that links this library has them (its CommandLine lists the
// flag file "etcd_flags" for --help). The gradsnap CLI has its own parser and calls
// EtcdOptionsFromFlags (etcd_client.h) with the same values.
#ifndef GRADSNAP_CLUSTER_ETCD_FLAGS_H_
#define GRADSNAP_CLUSTER_ETCD_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "cluster/etcd_client.h"

namespace gradsnap {
namespace cluster {

// EtcdOptions for the endpoints `etcd` (the program's --etcd) and the security flags as given.
// `etcd` empty: INVALID_ARGUMENT naming a security flag that is set (it needs --etcd), else an
// EtcdOptions without endpoints.
absl::StatusOr<EtcdOptions> EtcdOptionsFromCommandLine(const std::string& etcd);

}  // namespace cluster
}  // namespace gradsnap

#endif  // GRADSNAP_CLUSTER_ETCD_FLAGS_H_
