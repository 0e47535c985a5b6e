// Placement of shards on storage nodes in cluster mode (docs/protocol.md, "Cluster mode",
// "Placement"): rendezvous (highest-random-weight) hashing on node ids, never on addresses, so
// a node keeps its shards when its address changes, and every client ranks the live nodes the
// same way. Each shard key (job, rank) gives every node the score Mix64(node_hash ^ key_hash *
// kKeyMul); the R highest-scoring live nodes hold the shard and the next ones, in order, replace
// a replica that fails. A node joining takes only the shards it now wins (about R / N of them);
// a node leaving moves only its own copies.
//
// The node's hash is computed once per node, the key's once per shard, so ranking N nodes costs
// N multiply-xorshift rounds (benchmarks/placement_sim ranks a million shards over 1,000 nodes).
//
// Header-only, pure functions: thread-safe.
#ifndef GRADSNAP_CLUSTER_PLACEMENT_H_
#define GRADSNAP_CLUSTER_PLACEMENT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/hash64.h"

namespace gradsnap {
namespace cluster {

inline uint64_t NodeHash(const std::string& node_id) {
  return Mix64(Fnv1a64(node_id.data(), node_id.size()));
}

inline uint64_t ShardKeyHash(const std::string& job, int32_t rank) {
  uint64_t h = Fnv1a64(job.data(), job.size());
  h = Fnv1a64("\0", 1, h);
  return Mix64(Fnv1a64(&rank, sizeof(rank), h));
}

inline uint64_t RendezvousScore(uint64_t node_hash, uint64_t key_hash) {
  return Mix64(node_hash ^ (key_hash * 0x9e3779b97f4a7c15ull));
}

// The indices of the `want` best nodes (all when want >= size) for `key_hash`, best first. Ties
// (equal scores: practically never) go to the lower index.
inline std::vector<size_t> RankNodes(const std::vector<uint64_t>& node_hashes, uint64_t key_hash,
                                     size_t want) {
  std::vector<size_t> order(node_hashes.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<uint64_t> score(node_hashes.size());
  for (size_t i = 0; i < node_hashes.size(); ++i) {
    score[i] = RendezvousScore(node_hashes[i], key_hash);
  }
  want = std::min(want, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(want), order.end(),
                    [&](size_t a, size_t b) {
                      return score[a] != score[b] ? score[a] > score[b] : a < b;
                    });
  order.resize(want);
  return order;
}

// The node ids `ids` in the rendezvous order of (job, rank), best first.
inline std::vector<std::string> OrderNodeIds(const std::vector<std::string>& ids,
                                             const std::string& job, int32_t rank) {
  std::vector<uint64_t> hashes;
  for (const std::string& id : ids) hashes.push_back(NodeHash(id));
  std::vector<std::string> out;
  for (size_t i : RankNodes(hashes, ShardKeyHash(job, rank), ids.size())) out.push_back(ids[i]);
  return out;
}

}  // namespace cluster
}  // namespace gradsnap

#endif  // GRADSNAP_CLUSTER_PLACEMENT_H_
