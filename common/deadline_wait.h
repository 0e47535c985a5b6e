// A deadline on work that only a poll can see finish: a collective queued on a device stream
// (NCCL on CUDA, the simulated device's collectives), whose own library never gives up on a
// frozen peer. Device-agnostic: the caller supplies the poll (cudaEventQuery, a simulated
// stream's event) and what to abort when the deadline passes (ncclCommAbort, the simulated
// device's communicator).
//
// OVERVIEW
//   WaitWithDeadline polls `done` until it reports completion or an error, sleeping between
//   polls (a few yields first, then sleeps doubling from 20 us to 200 us, so a wait ends at most
//   about 0.2 ms after the work). When `timeout` passes first it calls `abort` once, then returns
//   UNAVAILABLE with one line: what did not complete, in how long, and that a peer is frozen or
//   gone. UNAVAILABLE, like a Gloo timeout: the rank exits 1 and the launcher restarts the job.
//
// THREAD SAFETY
//   A free function; `done` and `abort` run on the calling thread.
#ifndef GRADSNAP_COMMON_DEADLINE_WAIT_H_
#define GRADSNAP_COMMON_DEADLINE_WAIT_H_

#include <chrono>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsnap {

struct DeadlineWait {
  // What is waited for, for the message, e.g. "the gradient reduction on sim:0".
  absl::string_view what;
  // How long to wait; zero or less: no deadline (poll until done).
  std::chrono::milliseconds timeout{0};
  // What `abort` aborts, for the message, e.g. "the NCCL communicator".
  absl::string_view aborted;
};

// Whether `s` is the error of an expired WaitWithDeadline (UNAVAILABLE "collective deadline:
// ..."), so a failing rank can abort its other groups rather than wait for them too.
bool IsCollectiveDeadline(const absl::Status& s);

// The error of an expired wait: UNAVAILABLE "collective deadline: <what> did not complete in S s
// (--collective-timeout-s): a peer rank is frozen or gone; <aborted> aborted".
absl::Status CollectiveDeadlineError(const DeadlineWait& wait);

// `done`: true once the work completed, false while it runs, an error if it failed (returned as
// is). See the file comment.
absl::Status WaitWithDeadline(const DeadlineWait& wait,
                              absl::FunctionRef<absl::StatusOr<bool>()> done,
                              absl::FunctionRef<void()> abort);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_DEADLINE_WAIT_H_
