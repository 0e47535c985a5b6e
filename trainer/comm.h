// Collective communication between the ranks of one job (ZeRO-1 data parallelism).
//
// OVERVIEW
//   Comm is what the training loop needs from a process group: a reduce-scatter of the flat
//   gradient buffer into per-rank slices (RankSlice), an all-gather of the parameter slices, a
//   small all-reduce of doubles, point-to-point bytes, and a barrier. On CPU it is Gloo over TCP
//   (NewGlooComm); a single process uses NewLocalComm. Sums are taken in rank order
//   0, 1, ..., P-1 whatever the arrival order, so a run is bit-reproducible for a given world size.
//
// ERRORS
//   Gloo throws; every call converts its exceptions to UNAVAILABLE (peer gone, timeout) here.
//   Abort (from any thread) ends a wait at once; an aborted Gloo group leaks its Gloo context
//   when destroyed, since Gloo's thread may be stuck mid-message from a frozen peer holding a
//   lock that closing the context needs (the rank exits right after).
//
// THREAD SAFETY
//   One thread at a time per Comm, except Abort. Separate Comms (separate Gloo contexts) may be
//   used from different threads concurrently.
#ifndef GRADSNAP_TRAINER_COMM_H_
#define GRADSNAP_TRAINER_COMM_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsnap {
namespace trainer {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sums buf[0, total) over ranks; on return this rank's slice SliceOfRank(total, rank, P) of buf
  // holds the sum (the rest of buf is unspecified).
  virtual absl::Status ReduceScatter(float* buf, size_t total) = 0;
  // Every rank contributes its slice of buf; on return buf[0, total) holds all slices.
  virtual absl::Status AllGather(float* buf, size_t total) = 0;
  // Element-wise sum of vals[0, n) over ranks, in rank order.
  virtual absl::Status AllReduceSum(double* vals, size_t n) = 0;
  virtual absl::Status Send(int dst, uint32_t tag, const void* data, size_t n) = 0;
  virtual absl::Status Recv(int src, uint32_t tag, void* data, size_t n) = 0;
  virtual absl::Status Barrier() = 0;
  // Makes the operation under way (on any thread) and every later one fail at once with
  // UNAVAILABLE, like ncclCommAbort: what a deadline on this group's work calls when a peer is
  // frozen (common/deadline_wait.h). The group is unusable afterwards. Thread-safe.
  virtual void Abort() {}
};

std::unique_ptr<Comm> NewLocalComm();

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Rendezvous: a directory shared by all ranks (Gloo FileStore). Required.
  std::string rdzv_dir;
  // Distinguishes several groups rendezvousing in the same directory. Default: "train".
  std::string prefix = "train";
  // Address this rank listens on for its peers. Default: 127.0.0.1.
  std::string hostname = "127.0.0.1";
  // How long the rendezvous waits for every rank to join. Default: 300 s.
  std::chrono::milliseconds timeout{300000};
  // How long one operation (a collective, a send or receive) waits for its peers before it
  // fails with UNAVAILABLE: what a hung or frozen peer costs. Zero: no limit of its own, as
  // NCCL has none (a device's collectives, which the caller's deadline bounds and ends with
  // Abort). Default: 300 s.
  std::chrono::milliseconds op_timeout{300000};
};

// Connects a full mesh of TCP pairs; blocks until all world_size ranks have joined.
absl::StatusOr<std::unique_ptr<Comm>> NewGlooComm(const GlooOptions& options);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_COMM_H_
