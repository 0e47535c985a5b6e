// Per-job bearer-token authorization (DESIGN.md section 6, common/token.h).
//
// With no secret the server runs open and every call is allowed. With a secret, a call naming a
// job must carry metadata `authorization: Bearer gs1.<hex>` holding that job's token:
// missing or malformed -> UNAUTHENTICATED, a valid-looking token of another job ->
// PERMISSION_DENIED. Tokens never leave this class (not logged, not echoed in errors).
// In cluster mode a node holds the node-local jobs "<job>.r<rank>" (cluster/local_job.h): the
// token of <job> grants them too, so the cluster client reaches every node with its job's one
// token (the repairer, holding the secret, mints the local job's own token).
//
// Thread-safe (immutable after construction).
#ifndef GRADSNAP_SERVICE_AUTH_H_
#define GRADSNAP_SERVICE_AUTH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"

namespace gradsnap {
namespace service {

class Authorizer {
 public:
  // Empty secret: open server. cluster_mode: tokens of a cluster job also grant its local jobs.
  explicit Authorizer(std::string secret, bool cluster_mode = false)
      : secret_(std::move(secret)), cluster_mode_(cluster_mode) {}

  bool enabled() const { return !secret_.empty(); }
  // OK when the call may act on `job`.
  absl::Status CheckJob(const grpc::ServerContext& ctx, const std::string& job) const;
  // OK when auth is off or the call carries a well-formed token (of some job): lets an upload
  // refuse anonymous callers before it spends memory on them.
  absl::Status CheckHasToken(const grpc::ServerContext& ctx) const {
    if (!enabled()) return absl::OkStatus();
    return BearerToken(ctx).status();
  }
  // The subset of `jobs` the call may see (all of them when open); UNAUTHENTICATED without a
  // token when auth is on.
  absl::StatusOr<std::vector<std::string>> FilterJobs(const grpc::ServerContext& ctx,
                                                      std::vector<std::string> jobs) const;

 private:
  // The token from the metadata, or UNAUTHENTICATED.
  absl::StatusOr<std::string> BearerToken(const grpc::ServerContext& ctx) const;
  // Whether `token` grants `job`: its own token, or in cluster mode its cluster job's.
  bool Grants(const std::string& token, const std::string& job) const;

  const std::string secret_;
  const bool cluster_mode_;
};

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_AUTH_H_
