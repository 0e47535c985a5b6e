// Persistence of rank shards through the client library (client/client.h), as the checkpointers
// and the resume path see it.
//
// OVERVIEW
//   Remote mode (--storage): every rank has its own Client to the servers (DirectShardStore).
//   Embedded mode (--ckpt-dir): the engine's RocksDB can be opened by one process only, so with
//   several ranks rank 0 alone opens the Client and the others funnel their shards to it over a
//   dedicated communicator (FunnelShardStore). With one rank, embedded mode is a DirectShardStore
//   too. Restores go through recovery/ (trainer/resume.h).
//
// COLLECTIVE CALLS
//   SaveShard, ListCommitted and AllAgree are collective in the funneled store: every rank
//   calls them for the same checkpoints in the same order (rank 0 serves the others inside its
//   own call). Code written against ShardStore must keep to that rule in every mode.
//
// THREAD SAFETY
//   One thread at a time per rank (a checkpointer's background thread may own it).
#ifndef GRADSNAP_TRAINER_SHARD_STORE_H_
#define GRADSNAP_TRAINER_SHARD_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "recovery/state_source.h"
#include "trainer/comm.h"

namespace gradsnap {
namespace trainer {

class ShardStore {
 public:
  virtual ~ShardStore() = default;
  // Every rank calls it with the identical spec before saving its shard.
  virtual absl::Status BeginCheckpoint(const client::CheckpointSpec& spec) = 0;
  // Saves this rank's shard; returns when it is durable (and the checkpoint committed if it was
  // the last shard). Collective.
  virtual absl::Status SaveShard(const client::ShardSpec& spec,
                                 std::vector<client::TensorRef> tensors) = 0;
  // Committed checkpoints of `job`, oldest first. Collective; the same answer on every rank.
  virtual absl::StatusOr<std::vector<client::CheckpointInfo>> ListCommitted(
      const std::string& job) = 0;
  // The underlying client on this rank, or nullptr where this rank funnels through rank 0.
  virtual client::Client* client() = 0;

  // Writer fencing (docs/protocol.md, "Epochs"). AcquireEpoch takes the job's next epoch from
  // the store (rank 0; funneled ranks get 0); SetEpoch makes every later begin and save of this
  // store carry `epoch`, so a store of an older attempt is refused as superseded. The first
  // call of an attempt: it waits out an outage of the store (up to 30 s) before it fails.
  virtual absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) = 0;
  virtual void SetEpoch(uint64_t epoch) = 0;
  virtual uint64_t epoch() const = 0;
  // True on every rank of the job when `ok` is true on every rank. Collective, on the store's
  // own communicator (not the training one), so a persist thread may call it.
  virtual absl::StatusOr<bool> AllAgree(bool ok) = 0;
  // Saves are collective (funneled): a rank must not retry one on its own.
  virtual bool collective_saves() const = 0;
  // Aborts the store's communicator (Comm::Abort; from any thread): a failing rank's persist
  // thread stops waiting for a frozen peer. Later collective calls fail.
  virtual void AbortGroup() = 0;
};

// Each rank talks to `client` directly; `comm` (nullptr for one rank) carries AllAgree only.
std::unique_ptr<ShardStore> NewDirectShardStore(std::unique_ptr<client::Client> client,
                                                std::unique_ptr<Comm> comm = nullptr);
// Rank 0 owns `client` (nullptr on other ranks); shards travel over `comm`, which the store
// uses exclusively.
std::unique_ptr<ShardStore> NewFunnelShardStore(std::unique_ptr<client::Client> client,
                                                std::unique_ptr<Comm> comm);

// The checkpoints of `job` through `store`'s client, for a resume: every call waits out an
// outage of the store (UNAVAILABLE) for up to 30 s before it fails, as AcquireEpoch and
// ListCommitted do. nullptr on a rank without a client (a funneled rank other than 0).
std::unique_ptr<recovery::StateSource> NewRestoreSource(ShardStore& store, const std::string& job);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_SHARD_STORE_H_
