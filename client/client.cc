// Client::Connect: picks the back end (DESIGN.md section 6). Remote when endpoints are given,
// else the embedded engine in local_dir.
#include "client/client.h"

#include "client/backends.h"

namespace gradsnap {
namespace client {

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError("ClientOptions.max_attempts must be >= 1");
  }
  if (options.replicas < 1) {
    return absl::InvalidArgumentError("ClientOptions.replicas must be >= 1");
  }
  if (!options.endpoints.empty()) return NewRemoteClient(options);
  if (!options.local_dir.empty()) return NewEmbeddedClient(options);
  return absl::InvalidArgumentError(
      "ClientOptions needs endpoints (remote servers) or local_dir (embedded engine)");
}

}  // namespace client
}  // namespace gradsnap
