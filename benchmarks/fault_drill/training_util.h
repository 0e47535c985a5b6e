// Pieces of the training drill (benchmarks/fault_drill/training_scenario.h): child processes with
// their output in a file, a gradsnap-server that can be SIGKILLed and restarted on the same
// address, and checks of what a store lists.
//
// Thread safety: none; one drill runs on one thread.
#ifndef GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_UTIL_H_
#define GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "benchmarks/fault_drill/drill_util.h"
#include "client/client.h"

namespace gradsnap {
namespace drill {

// A child process whose stdout and stderr go to `log`.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();
  absl::Status Start(const std::vector<std::string>& argv, const std::string& log);
  // Exit status (0..255), 128 + signal when killed, or -1 while it still runs.
  int Poll();
  int Wait();
  void Signal(int sig);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// gradsnap-server on a fixed 127.0.0.1 port, restartable after a SIGKILL.
class Server {
 public:
  Server(std::string binary, std::string data_dir, std::vector<std::string> extra = {});
  ~Server();
  // Starts it (retrying while the port is still held) and waits for its listening line.
  absl::Status Start();
  void Kill();  // SIGKILL + reap
  const std::string& address() const { return address_; }

 private:
  const std::string binary_, data_dir_;
  const std::vector<std::string> extra_;
  std::string address_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
};

// A free TCP port on 127.0.0.1 (bound and released).
absl::StatusOr<int> FreePort();
std::string Slurp(const std::string& path);
// The value of `key=` in the last "summary " line of `output`, or "".
std::string SummaryField(const std::string& output, const std::string& key);
// Lines of `output` starting with `prefix`.
int CountLines(const std::string& output, const std::string& prefix);

// What a store lists for `job`, checked: every committed checkpoint verified (lost_data counts
// DATA_LOSS), committed checkpoints with a shard missing (partial_listed), committed DELTAs
// whose base FULL is not committed (orphan_deltas_listed), committed DELTAs whose predecessor
// in the chain is not committed (chain_holes_listed).
struct StoreReport {
  int listed = 0, fulls = 0, deltas = 0;
  int lost_data = 0, partial_listed = 0, orphan_deltas_listed = 0, chain_holes_listed = 0;
  int verify_errors = 0;  // other verification failures
};
absl::StatusOr<StoreReport> CheckStore(client::Client& c, const std::string& job);

}  // namespace drill
}  // namespace gradsnap

#endif  // GRADSNAP_BENCHMARKS_FAULT_DRILL_TRAINING_UTIL_H_
