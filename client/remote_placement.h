// Placement of shards over storage nodes for the remote client back end (DESIGN.md section 6):
// rendezvous (highest-random-weight) hashing. Each (job, rank) ranks every node by a hash of
// (key, job, rank); the first R are the shard's replicas and the rest are fallbacks, so
// adding or removing a node moves only the shards it wins or loses. A node's key is
// NodePlacementKey(its id) (Health's node_id), or its endpoint string while the id is unknown
// (docs/protocol.md, "Placement over a static list").
//
// Header-only, pure functions: thread-safe.
#ifndef GRADSNAP_CLIENT_REMOTE_PLACEMENT_H_
#define GRADSNAP_CLIENT_REMOTE_PLACEMENT_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/hash64.h"

namespace gradsnap {
namespace client {

// The placement key of the node with stable id `node_id`; never equal to a HOST:PORT.
inline std::string NodePlacementKey(const std::string& node_id) { return "node:" + node_id; }

// 64-bit FNV-1a followed by a splitmix64 finalizer (common/hash64.h): stable across runs and
// platforms.
inline uint64_t PlacementHash(const std::string& key, const std::string& job, int32_t rank) {
  uint64_t h = Fnv1a64(key.data(), key.size());
  h = Fnv1a64("\0", 1, h);
  h = Fnv1a64(job.data(), job.size(), h);
  h = Fnv1a64("\0", 1, h);
  h = Fnv1a64(&rank, sizeof(rank), h);
  return Mix64(h);
}

// Indices of `endpoints` (placement keys) in preference order for (job, rank); the first
// `replicas` hold it.
inline std::vector<size_t> RankEndpoints(const std::vector<std::string>& endpoints,
                                         const std::string& job, int32_t rank) {
  std::vector<size_t> order(endpoints.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<uint64_t> score(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) score[i] = PlacementHash(endpoints[i], job, rank);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  });
  return order;
}

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_REMOTE_PLACEMENT_H_
