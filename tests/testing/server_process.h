// ServerProcess: a real gradsnap-server child process for the tests and drills. It is started
// with any flags, ready once it printed "gradsnap-server listening on HOST:PORT[ NOTE]" on stdout,
// and can be signalled, killed and restarted on the same address. Its stderr (the server's
// log) goes to a file read back by Log().
//
// Not thread-safe per object; each test owns its servers.
#ifndef GRADSNAP_TESTS_TESTING_SERVER_PROCESS_H_
#define GRADSNAP_TESTS_TESTING_SERVER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace gradsnap {
namespace testing {

class ServerProcess {
 public:
  // `binary`: the gradsnap-server to run (tests get it as GRADSNAP_SERVER_BIN).
  explicit ServerProcess(std::string binary);
  // A running server gets SIGTERM and 10 s to exit (it syncs its catalog), then SIGKILL.
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts `binary args...` and waits up to 30 s for the readiness line. On failure a child that
  // still runs is SIGKILLed, and Wait() returns how it ended.
  absl::Status Start(const std::vector<std::string>& args);
  // Start({"--data-dir", data_dir, "--listen", listen, extra...}).
  absl::Status StartOn(const std::string& data_dir, const std::string& listen = "127.0.0.1:0",
                       const std::vector<std::string>& extra = {});
  // After Kill()/Wait(): the same flags again, listening on the address it had (a fixed port
  // when it was 127.0.0.1:0). Retries for up to `attempts` x 100 ms while the port is held.
  absl::Status Restart(int attempts = 50);

  // A command prefix the server runs under from its next start on (a network namespace's
  // NetNamespace::Wrap: ip netns exec execs it, so pid() stays the server's). Default: none.
  void set_wrap(std::vector<std::string> wrap) { wrap_ = std::move(wrap); }

  void Signal(int sig);
  // Reaps the child: its exit status, 128 + the signal that ended it; -1 when not running.
  int Wait();
  // SIGKILL, then Wait(); no-op when not running.
  void Kill();
  // SIGTERM (a graceful shutdown: the server syncs its catalog), then Wait(): its exit status.
  int Stop();
  // "running", or how the child ended (reaps it), for failure messages.
  std::string Describe();
  // Started, ready (its readiness line came), and not reaped since.
  bool running() const { return pid_ > 0 && ready_; }

  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  // The readiness line of the last start, without its newline.
  const std::string& ready_line() const { return ready_line_; }
  int port() const { return port_; }
  // The --metrics-listen port the server logged at start (0 if none).
  int metrics_port() const;
  // VmRSS of the child in bytes (0 if unknown).
  uint64_t RssBytes() const;
  // The child's stderr so far (its log, from its last start).
  std::string Log() const;

 private:
  absl::Status StartOnce(const std::vector<std::string>& args);

  const std::string binary_;
  std::vector<std::string> args_;  // of the last Start
  std::vector<std::string> wrap_;
  pid_t pid_ = -1;
  std::string address_;
  std::string ready_line_;
  int port_ = 0;
  bool ready_ = false;  // the last start got the readiness line
  std::string log_path_;
};

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_SERVER_PROCESS_H_
