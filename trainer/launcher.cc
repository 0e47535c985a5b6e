#include "trainer/launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace gradsnap {
namespace trainer {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

void InstallHandlers() {
  g_stop_signal = 0;  // a Launch starts unstopped (before the handlers, a signal kills)
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: waitpid returns EINTR so the loop sees the signal
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid != 0) return pid;  // parent, or -1
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "gradsnap-train: exec failed: %s\n", strerror(errno));
  _exit(127);
}

std::string Describe(int status) {
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("exited with status ", WEXITSTATUS(status));
}

// Stops every still-running child: SIGTERM, then SIGKILL after `grace`; reaps them all.
// Returns whether one of them had exited with kExitNoRestart meanwhile (a rank that found a
// permanent error while another, reaped first, died of its effects).
bool StopAll(std::vector<pid_t>& pids, int sig) {
  bool no_restart = false;
  for (pid_t p : pids) {
    if (p > 0) kill(p, sig);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t& p : pids) {
    while (p > 0) {
      int status;
      const pid_t r = waitpid(p, &status, WNOHANG);
      if (r == p || (r < 0 && errno != EINTR)) {
        no_restart = no_restart ||
                     (r == p && WIFEXITED(status) && WEXITSTATUS(status) == kExitNoRestart);
        p = 0;
      } else if (std::chrono::steady_clock::now() > deadline) {
        kill(p, SIGKILL);
        while (waitpid(p, &status, 0) < 0 && errno == EINTR) {
        }
        p = 0;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  return no_restart;
}

// How one attempt ended.
struct AttemptResult {
  bool ok = false;
  bool no_restart = false;
  bool interrupted = false;
  std::string reason;
  int64_t failed_at_ms = -1;  // when the failed rank was reaped (Unix ms)
};

// Several nodes: the launcher that sees one of its ranks fail says so in the attempt's
// rendezvous directory (kPeerFailedFile: "<node_rank> <failed_at_ms> <reason>"), and the other
// launchers, which poll for it while their ranks run, stop theirs at once instead of waiting
// until a collective of their own ranks breaks on the lost peer (up to a whole step later).
constexpr char kPeerFailedFile[] = "failed";
constexpr int kPeerPollMs = 5;

// Says this node's failure in `attempt_dir`, once per attempt (the first node to fail wins;
// link() makes the file appear whole, also on NFS). Best effort: without it the other nodes
// still learn of the failure from their collectives.
void SayNodeFailed(const std::string& attempt_dir, int node_rank, int64_t failed_at_ms,
                   const std::string& reason) {
  const std::string path = absl::StrCat(attempt_dir, "/", kPeerFailedFile);
  const std::string tmp = absl::StrCat(path, ".", node_rank, ".", getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f, "%d %lld %s\n", node_rank, static_cast<long long>(failed_at_ms),
               reason.c_str());
  const bool written = std::fclose(f) == 0;
  if (written) (void)::link(tmp.c_str(), path.c_str());  // EEXIST: another node said it first
  std::remove(tmp.c_str());
}

// The failure said in `attempt_dir` (kPeerFailedFile), if any: the node that said it, when (Unix
// ms, at most now) and why.
struct SaidFailure {
  int node = -1;
  int64_t at_ms = -1;
  std::string reason;
};
bool ReadNodeFailed(const std::string& attempt_dir, SaidFailure* said) {
  const std::string path = absl::StrCat(attempt_dir, "/", kPeerFailedFile);
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return false;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  int node = -1;
  long long at_ms = -1;
  int consumed = 0;
  if (!read || std::sscanf(line, "%d %lld %n", &node, &at_ms, &consumed) < 2) return false;
  said->node = node;
  said->at_ms = at_ms > 0 ? std::min<int64_t>(at_ms, UnixMillis()) : UnixMillis();
  said->reason = line + consumed;
  while (!said->reason.empty() && said->reason.back() == '\n') said->reason.pop_back();
  return true;
}

// Whether another node said it failed in this attempt; fills the reason and its failure time.
bool PeerNodeFailed(const std::string& attempt_dir, int node_rank, AttemptResult* result) {
  SaidFailure said;
  if (!ReadNodeFailed(attempt_dir, &said)) return false;
  if (said.node == node_rank) return false;  // this node's own (it fails by its own ranks)
  result->ok = false;
  result->failed_at_ms = said.at_ms;
  result->reason = absl::StrCat("node ", said.node, " failed (", said.reason, ")");
  return true;
}

// Several nodes: each launcher marks the attempts it runs ranks in with RDZV/attempt-K/node-I
// (its pid), before it starts them.
std::string NodeMark(const std::string& attempt_dir, int node_rank) {
  return absl::StrCat(attempt_dir, "/node-", node_rank);
}

void MarkNode(const std::string& attempt_dir, int node_rank) {
  if (FILE* f = std::fopen(NodeMark(attempt_dir, node_rank).c_str(), "w")) {
    std::fprintf(f, "%d\n", static_cast<int>(getpid()));
    std::fclose(f);
  }
}

// The newest attempt-N directory of `rdzv`, or -1 when there is none.
int NewestAttempt(const std::string& rdzv) {
  int newest = -1;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(rdzv, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int n = -1;
    if (name.rfind("attempt-", 0) == 0 && absl::SimpleAtoi(name.substr(8), &n) && n >= 0) {
      newest = std::max(newest, n);
    }
  }
  return newest;
}

// Where a launcher of several nodes starts: the job's newest attempt, unless this node ran
// ranks in it already. A launcher that is itself restarted (SIGKILLed with its machine, then
// started again by the machine's supervisor) finds its own mark in the attempt its killed
// ranks were part of: that attempt has failed. It says so there (the other launchers, which
// may still wait on their ranks' collectives, stop them at once) and starts the next attempt,
// which the others start too. Without its mark the newest attempt is one the others started
// without this node (or the job's first): it joins it.
struct FirstAttempt {
  int attempt = 0;
  int64_t failed_at_ms = -1;  // the failure that ended the previous attempt (Unix ms)
  std::string reason;         // and what it was
};
FirstAttempt JoinJob(const std::string& rdzv, int node_rank) {
  FirstAttempt first;
  const int newest = NewestAttempt(rdzv);
  if (newest < 0) return first;
  const std::string dir = absl::StrCat(rdzv, "/attempt-", newest);
  std::error_code ec;
  const bool ran_here = std::filesystem::exists(NodeMark(dir, node_rank), ec);
  first.attempt = ran_here ? newest + 1 : newest;
  if (ran_here) {
    SayNodeFailed(dir, node_rank, UnixMillis(),
                  absl::StrCat("the launcher of node ", node_rank, " restarted"));
  }
  if (first.attempt == 0) return first;  // the job's first attempt, another node started it
  SaidFailure said;
  const std::string failed_dir = absl::StrCat(rdzv, "/attempt-", first.attempt - 1);
  if (ReadNodeFailed(failed_dir, &said)) {
    first.failed_at_ms = said.at_ms;
    first.reason = said.node == node_rank ? said.reason
                                          : absl::StrCat("node ", said.node, " failed (",
                                                         said.reason, ")");
  } else {  // the others found the failure in their collectives, and said nothing
    first.failed_at_ms = UnixMillis();
    first.reason = absl::StrCat("attempt ", first.attempt - 1, " failed");
  }
  return first;
}

// failed_at_ms: when the previous attempt's failure was seen (-1 for the first attempt).
AttemptResult RunAttempt(const LaunchOptions& o, int attempt, const std::string& rdzv_dir,
                         int64_t failed_at_ms) {
  const int world = o.nproc * o.nnodes;
  std::vector<pid_t> pids(o.nproc, 0);
  for (int i = 0; i < o.nproc; ++i) {
    std::vector<std::string> args = {"gradsnap-train"};
    args.insert(args.end(), o.rank_args.begin(), o.rank_args.end());
    args.push_back(absl::StrCat("--rank=", o.node_rank * o.nproc + i));
    args.push_back(absl::StrCat("--local_rank=", i));  // picks the rank's device
    args.push_back(absl::StrCat("--world_size=", world));
    args.push_back(absl::StrCat("--attempt=", attempt));
    args.push_back(absl::StrCat("--rdzv_dir=", rdzv_dir));
    args.push_back(absl::StrCat("--launcher_pid=", getpid()));
    if (attempt > 0 && o.resume_on_restart) args.push_back("--resume=latest");
    if (attempt > 0 && failed_at_ms >= 0) {  // rank 0 prints the recovery time split
      args.push_back(absl::StrCat("--recovery_failed_at_ms=", failed_at_ms));
      args.push_back(absl::StrCat("--recovery_spawned_at_ms=", UnixMillis()));
    }
    pids[i] = Spawn(args);  // NOLINT: fork per rank
    if (pids[i] < 0) {
      StopAll(pids, SIGTERM);
      return AttemptResult{false, true, false, absl::StrCat("fork failed: ", strerror(errno))};
    }
  }
  int running = o.nproc;
  AttemptResult result;
  result.ok = true;
  while (running > 0) {
    // A stop signal that arrived outside waitpid (while spawning, stopping or cleaning up)
    // is seen here, not lost: waitpid would not return EINTR for it any more.
    if (g_stop_signal != 0) {
      StopAll(pids, g_stop_signal);
      return AttemptResult{false, true, true, "interrupted"};
    }
    int status = 0;
    // One node: block until a rank exits. Several: also poll for another node's failure.
    const pid_t pid = waitpid(-1, &status, o.nnodes > 1 ? WNOHANG : 0);
    if (pid == 0) {
      if (PeerNodeFailed(rdzv_dir, o.node_rank, &result)) {
        if (StopAll(pids, SIGTERM)) result.no_restart = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(kPeerPollMs));
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR && g_stop_signal != 0) {
        StopAll(pids, g_stop_signal);
        return AttemptResult{false, true, true, "interrupted"};
      }
      if (errno == EINTR) continue;
      break;  // ECHILD: nothing left
    }
    int rank = -1;
    for (int i = 0; i < o.nproc; ++i) {
      if (pids[i] == pid) rank = i, pids[i] = 0;
    }
    if (rank < 0) continue;
    --running;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    result.failed_at_ms = UnixMillis();
    result.ok = false;
    result.no_restart = WIFEXITED(status) && WEXITSTATUS(status) == kExitNoRestart;
    result.reason =
        absl::StrCat("rank ", o.node_rank * o.nproc + rank, " ", Describe(status));
    if (o.nnodes > 1) SayNodeFailed(rdzv_dir, o.node_rank, result.failed_at_ms, result.reason);
    if (StopAll(pids, SIGTERM)) result.no_restart = true;
    break;
  }
  return result;
}

}  // namespace

void SetRankEnvironmentDefaults() {
  ::setenv("OPENBLAS_THREAD_TIMEOUT", kOpenBlasThreadTimeout, /*overwrite=*/0);
}

int Launch(const LaunchOptions& o) {
  SetRankEnvironmentDefaults();
  InstallHandlers();
  std::string rdzv = o.rdzv;
  bool own_rdzv = false;
  if (rdzv.empty()) {
    char tmpl[] = "/tmp/gradsnap-rdzv-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::fprintf(stderr, "gradsnap-train: mkdtemp: %s\n", strerror(errno));
      return 1;
    }
    rdzv = tmpl;
    own_rdzv = true;
  }
  int exit_code = 1;
  int64_t failed_at_ms = -1;
  int first = 0;
  if (o.nnodes > 1) {  // a launcher restarted while the job runs joins it
    const FirstAttempt joined = JoinJob(rdzv, o.node_rank);
    first = joined.attempt;
    failed_at_ms = joined.failed_at_ms;
    if (first > o.max_restarts) {
      std::fprintf(stderr,
                   "gradsnap-train: the job in %s already ran %d attempt(s) (--max-restarts "
                   "%d): giving up\n",
                   rdzv.c_str(), first, o.max_restarts);
      return 1;
    }
    if (first > 0) {
      std::printf("restart %d of %d: %s; this node joins attempt %d, resuming all ranks from the "
                  "latest checkpoint\n",
                  first, o.max_restarts, joined.reason.c_str(), first);
      std::fflush(stdout);
    }
  }
  for (int attempt = first; attempt <= o.max_restarts; ++attempt) {
    const std::string dir = absl::StrCat(rdzv, "/attempt-", attempt);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      std::fprintf(stderr, "gradsnap-train: cannot create the rendezvous directory %s: %s\n",
                   dir.c_str(), ec.message().c_str());
      // A path that cannot be a directory, or may not be written, is bad input that no restart
      // mends (exit 2); anything else (a full disk, an I/O error) may pass (exit 1).
      const int e = ec.value();
      if (e == ENOTDIR || e == EEXIST || e == EACCES || e == EPERM || e == EROFS ||
          e == ENAMETOOLONG || e == ELOOP) {
        exit_code = kExitNoRestart;
      }
      break;
    }
    if (o.nnodes > 1) MarkNode(dir, o.node_rank);
    const AttemptResult r = RunAttempt(o, attempt, dir, failed_at_ms);
    failed_at_ms = r.failed_at_ms;
    if (r.ok) {
      exit_code = 0;
      break;
    }
    if (r.interrupted || g_stop_signal != 0) {  // also one that came while stopping the ranks
      if (!r.interrupted) {
        std::fprintf(stderr, "gradsnap-train: %s in attempt %d\n", r.reason.c_str(), attempt);
      }
      exit_code = 128 + g_stop_signal;
      break;
    }
    std::fprintf(stderr, "gradsnap-train: %s in attempt %d\n", r.reason.c_str(), attempt);
    if (r.no_restart) {
      exit_code = kExitNoRestart;
      break;
    }
    if (attempt < o.max_restarts) {
      std::printf("restart %d of %d: %s; resuming all ranks from the latest checkpoint\n",
                  attempt + 1, o.max_restarts, r.reason.c_str());
      std::fflush(stdout);
      if (o.before_restart) o.before_restart();
      if (g_stop_signal != 0) {  // stopped during the clean-up: no new attempt
        exit_code = 128 + g_stop_signal;
        break;
      }
    } else {
      std::fprintf(stderr, "gradsnap-train: giving up after %d restart(s)\n", o.max_restarts);
    }
  }
  if (own_rdzv) {
    std::error_code ec;
    std::filesystem::remove_all(rdzv, ec);
  }
  return exit_code;
}

}  // namespace trainer
}  // namespace gradsnap
