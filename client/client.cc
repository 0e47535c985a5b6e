// Client::Connect: picks the back end (DESIGN.md section 6). Remote when endpoints are given
// (Client::ConnectRemote, connect_remote.cc), else the embedded engine in local_dir.
#include "client/client.h"

#include "client/backends.h"
#include "common/populate.h"
#include "common/status.h"

namespace gradsnap {
namespace client {

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (!options.endpoints.empty() || !options.etcd.empty()) return ConnectRemote(options);
  RETURN_IF_ERROR(ValidateClientOptions(options));
  if (!options.local_dir.empty()) return NewEmbeddedClient(options);
  return absl::InvalidArgumentError(
      "ClientOptions needs endpoints (remote servers) or local_dir (embedded engine)");
}

FreshDestination::FreshDestination(const std::vector<std::pair<void*, size_t>>& ranges,
                                   bool fresh) {
  if (fresh) {
    for (const auto& [p, n] : ranges) AdviseBasePages(p, n);
  }
  populate_ = std::make_unique<PopulateAhead>(ranges);
}

FreshDestination::~FreshDestination() = default;

}  // namespace client
}  // namespace gradsnap
