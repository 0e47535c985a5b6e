// Checkpoint threads beside the work a process is for: a training rank's copies and persists.
//
// OVERVIEW
//   A rank's checkpoint threads share the cores with its training threads. Woken while a
//   training thread runs on a busy machine, one of them may be handed that thread's core: a
//   checkpoint hook that takes 20 us of CPU then waits milliseconds for its core back, which the
//   step counts as stall. Two roles keep them off the training threads' path:
//     kCopy        the copies the next step waits for (the copy dispatcher, the host device's
//                  copy streams): SCHED_BATCH at the training threads' nice value, so they get
//                  their full share of a core but never preempt a thread when they wake (the
//                  kernel's fair class lets only SCHED_NORMAL wakers preempt);
//     kBackground  the persist side (the snapshot engine's worker and replay, the thread that
//                  persists to the store, the embedded store's writer): SCHED_BATCH and the
//                  background nice value, so they also yield CPU to training when both want it.
//   SetBackgroundNice sets the process-wide nice value, before the threads start (0..19;
//   gradsnap-train's --ckpt-thread-nice, default 10). At 0 both roles leave a thread as it is
//   (the default, as in gradsnap-server). EnterRole applies a role to the calling thread; a
//   thread may always lower its own priority this way, so no privilege is needed.
//
// THREAD SAFETY
//   Thread-safe.
#ifndef GRADSNAP_COMMON_THREAD_PRIORITY_H_
#define GRADSNAP_COMMON_THREAD_PRIORITY_H_

namespace gradsnap {

enum class ThreadRole { kForeground, kCopy, kBackground };

// nice in 0..19 (clamped).
void SetBackgroundNice(int nice);
int BackgroundNice();
// The calling thread takes `role` (nothing for kForeground, or while the nice value is 0).
void EnterRole(ThreadRole role);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_THREAD_PRIORITY_H_
