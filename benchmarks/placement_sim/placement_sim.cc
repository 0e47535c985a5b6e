// placement_sim: cluster-mode placement on paper (issue 27, docs/protocol.md "Placement"). It
// places --shards shards (--jobs jobs x ranks, sizes drawn uniformly in [1, 2 x --shard-mib]
// MiB, a fixed seed) with --replicas copies on N nodes of random ids, by the rendezvous
// function the client uses (cluster/placement.h), for each N of --nodes, and prints one line
// per N:
//   imbalance        max / mean stored bytes per node (all copies counted)
//   join_moved       the fraction of stored bytes that moves when one node joins (ideal 1/(N+1))
//   join_other_moves copies that move between two old nodes on that join (rendezvous: 0)
//   leave_moved      the fraction of stored bytes that must be copied anew when one node leaves
//                    (its own copies: ideal 1/N)
//   leave_other_moves copies of the surviving nodes that move on that leave (rendezvous: 0)
//   repair_gib / repair_s  the bytes re-replicated after that node is lost and the time that
//                    takes when every node sends and receives at --node-gbps, each lost copy
//                    read from its first surviving replica and written to the next node in its
//                    order (the busiest node's bytes / bandwidth)
// Single-threaded, deterministic for a seed.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "benchmarks/common/bench_util.h"
#include "cluster/placement.h"

ABSL_FLAG(int64_t, shards, 1000000, "Shards to place. Default: 1000000.");
ABSL_FLAG(int, jobs, 1000, "Jobs the shards belong to (shards / jobs ranks each). Default: 1000.");
ABSL_FLAG(std::string, nodes, "10,30,100,300,1000", "Node counts, comma-separated. Default: 10,30,100,300,1000.");
ABSL_FLAG(int, replicas, 3, "Copies of each shard (R). Default: 3.");
ABSL_FLAG(double, shard_mib, 256, "Mean shard size in MiB (sizes uniform in [1, 2 x mean]). Default: 256.");
ABSL_FLAG(double, node_gbps, 10, "Per-node network bandwidth for repair, Gbit/s each way. Default: 10.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of node ids and shard sizes. Default: 1.");

namespace {

using gradsnap::cluster::NodeHash;
using gradsnap::cluster::RendezvousScore;
using gradsnap::cluster::ShardKeyHash;

struct Figures {
  double imbalance = 0, join_moved = 0, leave_moved = 0, repair_gib = 0, repair_s = 0;
  int64_t join_other_moves = 0, leave_other_moves = 0;
};

// The best `k` (<= 8) of `n` node scores for one key, best first, skipping node `skip` (-1:
// none): a selection without sorting all n.
int TopK(const std::vector<uint64_t>& nodes, size_t n, uint64_t key, int k, int64_t skip,
         size_t* out) {
  uint64_t best[8];
  int have = 0;
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<int64_t>(i) == skip) continue;
    const uint64_t s = RendezvousScore(nodes[i], key);
    if (have == k && s <= best[k - 1]) continue;
    int j = have < k ? have++ : k - 1;
    while (j > 0 && best[j - 1] < s) {
      best[j] = best[j - 1];
      out[j] = out[j - 1];
      --j;
    }
    best[j] = s;
    out[j] = i;
  }
  return have;
}

Figures Simulate(int n, int64_t shards, int jobs, int r, double mean_mib, double gbps,
                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  // n old nodes and one joining node (index n); node 0 is the one that leaves.
  std::vector<uint64_t> node(n + 1);
  for (auto& h : node) h = NodeHash(absl::StrFormat("%016x", rng()));
  std::uniform_real_distribution<double> size_mib(1, 2 * mean_mib - 1);
  const int64_t ranks = (shards + jobs - 1) / jobs;
  std::vector<double> held(n), sent(n), received(n);
  double total = 0, join_bytes = 0, leave_bytes = 0;
  Figures f;
  size_t with_new[8], old_order[8];
  for (int64_t s = 0; s < shards; ++s) {
    const std::string job = absl::StrFormat("job-%d", s / ranks);
    const uint64_t key = ShardKeyHash(job, static_cast<int32_t>(s % ranks));
    const double bytes = size_mib(rng) * (1 << 20);
    // The old placement and its fallbacks (R + 1 best of the n old nodes), and the placement
    // once node n has joined.
    const int k = TopK(node, n, key, std::min(r + 1, n), -1, old_order);
    const int kr = std::min(r, k);
    TopK(node, n + 1, key, std::min(r, n + 1), -1, with_new);
    for (int i = 0; i < kr; ++i) {
      held[old_order[i]] += bytes;
      total += bytes;
    }
    // Join: the new node enters the top R, pushing out the old R-th; anything else is a move
    // between old nodes.
    for (int i = 0; i < std::min(r, n + 1); ++i) {
      if (with_new[i] == static_cast<size_t>(n)) {
        join_bytes += bytes;
      } else {
        bool was = false;
        for (int j = 0; j < kr; ++j) was |= old_order[j] == with_new[i];
        if (!was) ++f.join_other_moves;
      }
    }
    // Leave of node 0: its copy goes to the next node in order, read from the first survivor.
    bool lost = false;
    for (int i = 0; i < kr; ++i) lost |= old_order[i] == 0;
    if (lost && k > kr) {
      leave_bytes += bytes;
      size_t source = old_order[0] == 0 ? old_order[1] : old_order[0];
      sent[source] += bytes;
      received[old_order[kr]] += bytes;
    }
    // Placement without node 0 is the old order minus node 0: nothing else moves by
    // construction, which the check below confirms on a sample.
    if (s % 997 == 0) {
      size_t without[8];
      const int kw = TopK(node, n, key, std::min(r, n - 1), /*skip=*/0, without);
      for (int i = 0; i < kw; ++i) {
        bool was = false;
        for (int j = 0; j < kr; ++j) was |= old_order[j] == without[i];
        if (!was && !(lost && without[i] == old_order[kr])) ++f.leave_other_moves;
      }
    }
  }
  double max_held = 0, max_io = 0;
  for (int i = 0; i < n; ++i) {
    max_held = std::max(max_held, held[i]);
    if (i != 0) max_io = std::max({max_io, sent[i], received[i]});
  }
  f.imbalance = max_held / (total / n);
  f.join_moved = join_bytes / total;
  f.leave_moved = leave_bytes / total;
  f.repair_gib = leave_bytes / (1ull << 30);
  f.repair_s = max_io / (gbps * 1e9 / 8);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(
      argc, argv, "placement_sim",
      "[--shards N] [--nodes 10,100,1000] [--replicas R] [--shard-mib M] [--node-gbps G]");
  const int r = absl::GetFlag(FLAGS_replicas);
  const int64_t shards = absl::GetFlag(FLAGS_shards);
  const int jobs = absl::GetFlag(FLAGS_jobs);
  if (r < 1 || r > 7 || shards < 1 || jobs < 1 || absl::GetFlag(FLAGS_shard_mib) < 1 ||
      absl::GetFlag(FLAGS_node_gbps) <= 0) {
    gradsnap::bench::BadFlag(
        "--replicas 1..7, --shards, --jobs >= 1, --shard-mib >= 1, --node-gbps > 0");
  }
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 2 || n > 100000) {
      gradsnap::bench::BadFlag(absl::StrCat("--nodes: \"", part, "\" is not a count 2..100000"));
    }
    Figures f = Simulate(n, shards, jobs, r, absl::GetFlag(FLAGS_shard_mib),
                         absl::GetFlag(FLAGS_node_gbps), absl::GetFlag(FLAGS_seed));
    std::printf(
        "nodes=%d shards=%lld replicas=%d imbalance=%.3f join_moved=%.5f (ideal %.5f) "
        "join_other_moves=%lld leave_moved=%.5f (ideal %.5f) leave_other_moves=%lld "
        "repair_gib=%.0f repair_s=%.1f at %.0f Gbit/s per node\n",
        n, static_cast<long long>(shards), r, f.imbalance, f.join_moved, 1.0 / (n + 1),
        static_cast<long long>(f.join_other_moves), f.leave_moved, 1.0 / n,
        static_cast<long long>(f.leave_other_moves), f.repair_gib, f.repair_s,
        absl::GetFlag(FLAGS_node_gbps));
    std::fflush(stdout);
  }
  return 0;
}
