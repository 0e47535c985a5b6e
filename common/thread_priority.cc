// The checkpoint threads' scheduling roles; see thread_priority.h.
#include "common/thread_priority.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

namespace gradsnap {
namespace {
std::atomic<int> g_nice{0};
}  // namespace

void SetBackgroundNice(int nice) { g_nice.store(std::clamp(nice, 0, 19)); }

int BackgroundNice() { return g_nice.load(); }

void EnterRole(ThreadRole role) {
  const int nice = g_nice.load();
  if (role == ThreadRole::kForeground || nice == 0) return;
  // A failure leaves the thread as it was: it only costs the stall the role is meant to save.
  // Linux: pid 0 is the calling thread; PRIO_PROCESS with a thread id sets that thread alone.
  sched_param param{};
  (void)sched_setscheduler(0, SCHED_BATCH, &param);
  if (role == ThreadRole::kBackground) {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
  }
}

}  // namespace gradsnap
