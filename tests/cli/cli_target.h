// Where the CLI end-to-end tests keep their checkpoints: an embedded engine directory, or a real
// gradsnap-server process on 127.0.0.1.
#ifndef GRADSNAP_TESTS_CLI_CLI_TARGET_H_
#define GRADSNAP_TESTS_CLI_CLI_TARGET_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace gradsnap {
namespace testing {

class CliTarget {
 public:
  virtual ~CliTarget() = default;
  // Global flags that point the CLI at this target.
  virtual std::vector<std::string> Flags() const = 0;
  // A library client on the same target (nullptr on failure, reported with ADD_FAILURE).
  virtual std::unique_ptr<client::Client> OpenClient(const std::string& token = "") const = 0;
};

// "embedded" and "server".
std::vector<std::string> CliTargetNames();
// Sets up the target `name` under `scratch`; INVALID_ARGUMENT for an unknown name.
// `server_args` are extra gradsnap-server flags (e.g. --auth-secret-file F).
absl::StatusOr<std::unique_ptr<CliTarget>> MakeTarget(
    const std::string& name, const std::string& scratch,
    const std::vector<std::string>& server_args = {});

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_CLI_CLI_TARGET_H_
