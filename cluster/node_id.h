// The stable id of a storage node in cluster mode (docs/protocol.md, "Cluster mode"): 16
// lowercase hex digits (64 random bits) made at the node's first start and kept in
// <data-dir>/node_id, so a node keeps its id across restarts and address changes, and
// placement (cluster/placement.h) ranks ids, never addresses.
//
// Thread-compatible: called once at start.
#ifndef GRADSNAP_CLUSTER_NODE_ID_H_
#define GRADSNAP_CLUSTER_NODE_ID_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {
namespace cluster {

// The file under the data directory.
inline constexpr char kNodeIdFile[] = "node_id";

// 16 lowercase hex digits.
bool IsValidNodeId(absl::string_view id);

// The id in <data_dir>/node_id; when the file is absent, a new random id written there
// durably (temporary file, fsync, rename, fsync of the directory) first. DATA_LOSS when the
// file holds something else than an id (it is never overwritten).
absl::StatusOr<std::string> LoadOrCreateNodeId(const std::string& data_dir);

}  // namespace cluster
}  // namespace gradsnap

#endif  // GRADSNAP_CLUSTER_NODE_ID_H_
