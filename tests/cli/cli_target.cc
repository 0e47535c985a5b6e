#include "tests/cli/cli_target.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/test_util.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/server_process.h"

namespace gradsnap {
namespace testing {
namespace {

class EmbeddedTarget : public CliTarget {
 public:
  explicit EmbeddedTarget(std::string dir) : dir_(std::move(dir)) {}
  std::vector<std::string> Flags() const override { return {"--ckpt-dir", dir_}; }
  std::unique_ptr<client::Client> OpenClient(const std::string&) const override {
    return ValueOrNull(client::testing::ConnectLocal(dir_));
  }

 private:
  std::string dir_;
};

// A gradsnap-server child process on 127.0.0.1 with a free port.
class ServerTarget : public CliTarget {
 public:
  absl::Status Start(const std::string& scratch, const std::vector<std::string>& extra) {
    RETURN_IF_ERROR(server_.StartOn(scratch + "/server-data", "127.0.0.1:0", extra));
    address_ = server_.address();
    return absl::OkStatus();
  }

  std::vector<std::string> Flags() const override { return {"--server", address_}; }
  std::unique_ptr<client::Client> OpenClient(const std::string& token) const override {
    client::ClientOptions o;
    o.endpoints = {address_};
    o.token = token;
    return ValueOrNull(client::Client::Connect(o));
  }

 private:
  ServerProcess server_{GRADSNAP_SERVER_PATH};
  std::string address_;
};

}  // namespace

std::vector<std::string> CliTargetNames() { return {"embedded", "server"}; }

absl::StatusOr<std::unique_ptr<CliTarget>> MakeTarget(
    const std::string& name, const std::string& scratch,
    const std::vector<std::string>& server_args) {
  if (name == "embedded") {
    std::string dir = scratch + "/ckpt";
    std::filesystem::create_directories(dir);
    return std::unique_ptr<CliTarget>(new EmbeddedTarget(dir));
  }
  if (name == "server") {
    auto t = std::make_unique<ServerTarget>();
    absl::Status st = t->Start(scratch, server_args);
    if (!st.ok()) return st;
    return std::unique_ptr<CliTarget>(std::move(t));
  }
  return absl::InvalidArgumentError("no CLI test target " + name);
}

}  // namespace testing
}  // namespace gradsnap
