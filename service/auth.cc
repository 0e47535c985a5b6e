#include "service/auth.h"

#include "absl/strings/match.h"
#include "common/local_job.h"
#include "common/status.h"
#include "common/token.h"

namespace gradsnap {
namespace service {
namespace {

constexpr size_t kMaxTokenLength = 256;

}  // namespace

absl::StatusOr<std::string> Authorizer::BearerToken(const grpc::ServerContext& ctx) const {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing authorization metadata (Bearer token)");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (value.size() > kMaxTokenLength || !absl::StartsWith(value, "Bearer ")) {
    return absl::UnauthenticatedError("malformed authorization metadata");
  }
  value.remove_prefix(7);
  if (!absl::StartsWith(value, "gs1.")) return absl::UnauthenticatedError("malformed token");
  return std::string(value);
}

bool Authorizer::Grants(const std::string& token, const std::string& job) const {
  if (CheckJobToken(secret_, job, token)) return true;
  std::string cluster_job;
  int32_t rank = 0;
  return cluster_mode_ && cluster::SplitLocalJob(job, &cluster_job, &rank) &&
         CheckJobToken(secret_, cluster_job, token);
}

absl::Status Authorizer::CheckJob(const grpc::ServerContext& ctx, const std::string& job) const {
  if (!enabled()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string token, BearerToken(ctx));
  if (!Grants(token, job)) {
    return absl::PermissionDeniedError("token does not grant access to this job");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Authorizer::FilterJobs(
    const grpc::ServerContext& ctx, std::vector<std::string> jobs) const {
  if (!enabled()) return jobs;
  ASSIGN_OR_RETURN(std::string token, BearerToken(ctx));
  std::vector<std::string> visible;
  for (auto& job : jobs) {
    if (Grants(token, job)) visible.push_back(std::move(job));
  }
  return visible;
}

}  // namespace service
}  // namespace gradsnap
