// Helpers of the fault drill (benchmarks/fault_drill): real gradsnap-server processes started,
// killed and restarted, commands run to their exit, temporary directories, file counts.
//
// Not thread-safe per object.
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace gradsnap {
namespace drill {

struct DrillOptions {
  std::string server_bin;  // gradsnap-server
  std::string cli_bin;     // gradsnap
  std::string train_bin;   // gradsnap-train
  std::string work_dir;    // parent of the drill's temporary directories
  int rounds = 4;          // storage: damage-and-rebuild rounds
  uint64_t shard_bytes = 8 << 20;
  uint64_t seed = 1;
  bool keep = false;       // keep the temporary directories (for a post-mortem)
  // Training scenario (training_scenario.h):
  std::string bin_dir;     // holds gradsnap-server and gradsnap-train
  int kills = 20;          // server SIGKILLs while the job trains
  bool quick = false;      // CI-sized: shorter outages and runs
};

// A fresh directory under `parent`, removed (with its contents) on destruction unless kept.
class TempTree {
 public:
  TempTree(const std::string& parent, const std::string& tag, bool keep);
  ~TempTree();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool keep_;
};

// A gradsnap-server child process.
class ServerProc {
 public:
  ServerProc() = default;
  ServerProc(const ServerProc&) = delete;
  ServerProc& operator=(const ServerProc&) = delete;
  ~ServerProc();  // SIGKILLs a still-running child

  // Starts `bin args...` and waits up to 30 s for "gradsnap-server listening on HOST:PORT".
  absl::Status Start(const std::string& bin, const std::vector<std::string>& args);
  void Signal(int sig);
  // Reaps the child: its exit status, or 128 + the signal that ended it.
  int Wait();
  bool running() const { return pid_ > 0; }
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  std::string Log() const;  // stderr so far

 private:
  pid_t pid_ = -1;
  std::string address_;
  int port_ = 0;
  std::string log_path_;
};

struct ExitResult {
  int code = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
};
// Runs `bin args...` to its exit (SIGKILLed after timeout_s), capturing stdout and stderr.
ExitResult RunToExit(const std::string& bin, const std::vector<std::string>& args,
                     int timeout_s = 120);

// Regular files below dir (0 if it does not exist).
int CountFiles(const std::string& dir);

// "k=v k=v ..." of a scenario's results, in key order.
std::string FormatKv(const std::map<std::string, std::string>& kv);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_DRILL_UTIL_H_
