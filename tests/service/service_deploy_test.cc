// Deploying gradsnap-server, against real server processes: --config FILE (every flag as a
// `key = value` line, the command line overriding it, one line and exit 2 for a bad file) and
// the gRPC health checking service (grpc.health.v1.Health) asked by a real gRPC client: SERVING
// once ready, NOT_SERVING while the node refuses writes on a full disk and again when space is
// back, NOT_SERVING from a SIGTERM on.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/service/health.grpc.pb.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

namespace fs = std::filesystem;
using HealthResponse = grpc::health::v1::HealthCheckResponse;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

std::unique_ptr<grpc::health::v1::Health::Stub> HealthStub(const std::string& address) {
  return grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// Check(service): the status, or UNKNOWN with the RPC's error in *error.
HealthResponse::ServingStatus Check(grpc::health::v1::Health::Stub* stub,
                                    const std::string& service, grpc::Status* error = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  HealthResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (error != nullptr) *error = s;
  return s.ok() ? resp.status() : HealthResponse::UNKNOWN;
}

// A Watch stream of one service name, bounded by a 60 s deadline.
class Watcher {
 public:
  Watcher(grpc::health::v1::Health::Stub* stub, const std::string& service) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    reader_ = stub->Watch(&ctx_, req);
  }
  ~Watcher() { ctx_.TryCancel(); }
  // The next status sent, or UNKNOWN when the stream ended.
  HealthResponse::ServingStatus Next() {
    HealthResponse resp;
    return reader_->Read(&resp) ? resp.status() : HealthResponse::UNKNOWN;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<HealthResponse>> reader_;
};

TEST(ServiceDeploy, ConfigFileSetsFlagsAndTheCommandLineOverridesIt) {
  TempDir dir;
  WriteText(dir.File("secret"), "0123456789abcdef0123456789abcdef");
  const std::string conf = dir.File("server.conf");
  // A reserve of 1 PiB: the node refuses writes, which its ready line says.
  WriteText(conf, absl::StrCat("# a storage node\n\n",
                               "data-dir = ", dir.File("data"), "\n",
                               "  listen=127.0.0.1:0   # any free port\n",
                               "auth_secret_file = ", dir.File("secret"), "\n",
                               "catalog-reserve-bytes = 1125899906842624\n",
                               "prefault-read-ahead = false\n",
                               "shutdown-grace-ms = 2000\n"));
  // The command line wins over the file, before or after --config (the store is made here:
  // a new store needs its reserve free).
  for (bool flag_first : {true, false}) {
    std::vector<std::string> args = {"--config", conf};
    args.insert(flag_first ? args.begin() : args.end(), "--catalog-reserve-bytes=0");
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.Start(args).ok()) << server.Log();
    EXPECT_FALSE(absl::StrContains(server.ready_line(), "writes refused")) << server.ready_line();
    EXPECT_EQ(server.Stop(), 0);
  }
  // From the file alone: the node (now made) refuses writes.
  {
    ServerProcess server(GRADSNAP_SERVER_BIN);
    ASSERT_TRUE(server.Start({"--config", conf}).ok()) << server.Log();
    EXPECT_TRUE(absl::StrContains(server.ready_line(), "writes refused")) << server.ready_line();
    grpc::ClientContext ctx;
    v1::HealthRequest req;
    v1::HealthResponse resp;
    ASSERT_TRUE(RawStub(server.address())->Health(&ctx, req, &resp).ok());
    EXPECT_TRUE(resp.auth_required());  // auth_secret_file came from the file
    EXPECT_EQ(server.Stop(), 0);
  }
}

TEST(ServiceDeploy, BadConfigFileIsOneLineAndExit2) {
  TempDir dir;
  const std::string conf = dir.File("server.conf");
  const std::string good = absl::StrCat("data-dir = ", dir.File("data"), "\n");
  struct Case {
    std::string text;
    std::string expected;  // in the one line on stderr
  };
  const Case cases[] = {
      {good + "data-dri = x\n", conf + ":2: unknown key 'data-dri'"},
      {good + "keepalive-ms = soon\n", conf + ":2: bad value 'soon' for key 'keepalive-ms'"},
      {good + "prefault-read-ahead = maybe\n", "bad value 'maybe' for key 'prefault-read-ahead'"},
      {good + "listen\n", conf + ": line 2: expected 'key = value'"},
      {good + "--listen = 127.0.0.1:0\n", conf + ": line 2: bad key '--listen'"},
      {good + "data_dir = /elsewhere\n", conf + ": line 2: key 'data_dir' given twice"},
      {good + "config = " + conf + "\n", conf + ":2: a config file cannot name another"},
      {good + "helpfull = true\n", conf + ":2: unknown key 'helpfull'"},  // not a server flag
      {good + "durable-every-mib = 0\n", "--durable-every-mib must be 1..4096"},
      {good + "digest = md5\n", "--digest must be xxh3 or sha256"},
  };
  for (const Case& c : cases) {
    WriteText(conf, c.text);
    RunResult r = RunProgram(GRADSNAP_SERVER_BIN, {"--config", conf}, 60);
    EXPECT_EQ(r.exit_code, 2) << c.text << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << c.text << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.expected)) << c.text << r.err;
    EXPECT_EQ(r.out, "") << c.text;
  }
  RunResult missing = RunProgram(GRADSNAP_SERVER_BIN, {"--config", dir.File("nope.conf")}, 60);
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_EQ(CountLines(missing.err), 1) << missing.err;
  EXPECT_TRUE(absl::StrContains(missing.err, "nope.conf")) << missing.err;
  // A bad flag on the command line is exit 2 too, file or not.
  RunResult flag = RunProgram(GRADSNAP_SERVER_BIN, {"--data-dri", dir.File("data")}, 60);
  EXPECT_EQ(flag.exit_code, 2) << flag.err;
  EXPECT_EQ(flag.err, "gradsnap-server: unknown flag --data-dri (see gradsnap-server --help)\n");
  EXPECT_FALSE(fs::exists(dir.File("data")));  // nothing started
}

TEST(ServiceDeploy, HealthServiceServingUntilShutdown) {
  TempDir dir;
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir.File("data"), "127.0.0.1:0", {"--shutdown-grace-ms", "2000"})
                  .ok());
  auto stub = HealthStub(server.address());
  EXPECT_EQ(Check(stub.get(), ""), HealthResponse::SERVING);
  EXPECT_EQ(Check(stub.get(), "gradsnap.v1.Storage"), HealthResponse::SERVING);
  EXPECT_EQ(Check(stub.get(), "gradsnap.v1.Storage/read"), HealthResponse::SERVING);
  grpc::Status error;
  EXPECT_EQ(Check(stub.get(), "no.such.Service", &error), HealthResponse::UNKNOWN);
  EXPECT_EQ(error.error_code(), grpc::StatusCode::NOT_FOUND) << error.error_message();
  {
    Watcher unknown(stub.get(), "no.such.Service");
    EXPECT_EQ(unknown.Next(), HealthResponse::SERVICE_UNKNOWN);
  }
  Watcher watch(stub.get(), "");
  Watcher watch_read(stub.get(), "gradsnap.v1.Storage/read");
  EXPECT_EQ(watch.Next(), HealthResponse::SERVING);
  EXPECT_EQ(watch_read.Next(), HealthResponse::SERVING);
  // A graceful stop: every name turns NOT_SERVING while calls drain, then the server exits.
  server.Signal(SIGTERM);
  EXPECT_EQ(watch.Next(), HealthResponse::NOT_SERVING);
  EXPECT_EQ(watch_read.Next(), HealthResponse::NOT_SERVING);
  EXPECT_EQ(server.Wait(), 0);
}

// A node on a real file system (a 64 MiB tmpfs) with the default 16 MiB catalog reserve:
// SERVING; a ballast file leaves 4 MiB free: NOT_SERVING for writes while reads stay SERVING;
// the ballast removed: SERVING again, without a restart.
TEST(ServiceDeploy, HealthFollowsAFullDisk) {
  TempDir dir;
  Tmpfs tmpfs(dir.File("mnt"));
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir.File("mnt") + "/data", "127.0.0.1:0",
                             {"--prefault-uploads", "0", "--shutdown-grace-ms", "2000"})
                  .ok())
      << server.Log();
  auto stub = HealthStub(server.address());
  Watcher watch(stub.get(), "");
  EXPECT_EQ(watch.Next(), HealthResponse::SERVING);
  FillUpLeaving(dir.File("mnt") + "/ballast", 4 << 20);
  EXPECT_EQ(watch.Next(), HealthResponse::NOT_SERVING);
  EXPECT_EQ(Check(stub.get(), "gradsnap.v1.Storage"), HealthResponse::NOT_SERVING);
  EXPECT_EQ(Check(stub.get(), "gradsnap.v1.Storage/read"), HealthResponse::SERVING);
  fs::remove(dir.File("mnt") + "/ballast");
  EXPECT_EQ(watch.Next(), HealthResponse::SERVING);
  EXPECT_EQ(Check(stub.get(), ""), HealthResponse::SERVING);
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
