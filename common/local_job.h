// The node-local job of a cluster shard (docs/protocol.md, "Cluster mode"): rank `rank` of
// cluster job `job` is held on a storage node as a one-rank checkpoint of the job
// "<job>.r<rank>".
//
// In common/ (namespace cluster) so that the service's Authorizer, which does not link the
// cluster library, shares it.
//
// Header-only, pure functions: thread-safe.
#ifndef GRADSNAP_COMMON_LOCAL_JOB_H_
#define GRADSNAP_COMMON_LOCAL_JOB_H_

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"

namespace gradsnap {
namespace cluster {

inline std::string LocalJob(const std::string& job, int32_t rank) {
  return job + ".r" + std::to_string(rank);
}

// "<job>.r<rank>" -> (job, rank); false for a local job of another shape.
inline bool SplitLocalJob(const std::string& local, std::string* job, int32_t* rank) {
  const size_t dot = local.rfind(".r");
  if (dot == std::string::npos || dot == 0) return false;
  *job = local.substr(0, dot);
  return absl::SimpleAtoi(local.substr(dot + 2), rank) && *rank >= 0 &&
         LocalJob(*job, *rank) == local;
}

}  // namespace cluster
}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_LOCAL_JOB_H_
