// Cluster mode towards a secured etcd (docs/deploy.md, "Cluster"): a real etcd with TLS and
// client certificates (certificates made with openssl by the test), and one with user
// authentication enabled (etcdctl user add, auth enable); real gradsnap-server, gradsnap CLI,
// gradsnap-train and ClientOptions clients against them. Wrong certificates and passwords are
// one clear line.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/etcd_client.h"
#include "gtest/gtest.h"
#include "service_test_util.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/process.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {
namespace {

// Runs gradsnap-server with `flags` until it fails to start (never ready): its stderr.
RunResult ServerThatFails(const std::string& data_dir, const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"--data-dir", data_dir, "--listen", "127.0.0.1:0",
                                   "--advertise", "127.0.0.1:7070"};
  args.insert(args.end(), flags.begin(), flags.end());
  return RunProgram(GRADSNAP_SERVER_BIN, args, /*timeout_s=*/60);
}

void ExpectOneLine(const RunResult& r, int code, const std::string& has) {
  EXPECT_EQ(r.exit_code, code) << r.out << r.err;
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(has), std::string::npos) << "wanted \"" << has << "\" in: " << r.err;
}

// Saves and restores one 1 MiB shard of (job, 1) through `c`.
void SaveAndRestore(client::Client* c, const std::string& job) {
  auto epoch = c->AcquireEpoch(job);
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  auto shard = SaveOneRank(c, job, 1, *epoch, 9);
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto back = RestoreToString(c, job, 1, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == shard->Payload());
}

TEST(ClusterEtcdSecurity, BadSecurityFlagsExitTwoWithOneLine) {
  TempDir dir("etcd-sec-flags");
  const std::string data = dir.File("data");
  ExpectOneLine(ServerThatFails(data, {"--etcd", "127.0.0.1:2379", "--etcd-ca", "/x"}), 2,
                "need https://");
  ExpectOneLine(ServerThatFails(data, {"--etcd", "https://127.0.0.1:2379,127.0.0.1:2380"}), 2,
                "mixed");
  ExpectOneLine(ServerThatFails(data, {"--etcd", "https://127.0.0.1:2379", "--etcd-cert", "/x"}),
                2, "go together");
  ExpectOneLine(ServerThatFails(data, {"--etcd", "127.0.0.1:2379", "--etcd-user", "u"}), 2,
                "needs a password");
  ExpectOneLine(ServerThatFails(data, {"--etcd", "127.0.0.1:2379", "--etcd-user", "u",
                                       "--etcd-password-file", dir.File("missing")}),
                2, "--etcd-password-file");
  RunResult cli = RunProgram(GRADSNAP_CLI_BIN, {"--etcd-user", "u", "ls"}, 60);
  EXPECT_EQ(cli.exit_code, 2) << cli.err;
  cli = RunProgram(GRADSNAP_CLI_BIN, {"--etcd", "127.0.0.1:2379", "--etcd-key", "/x", "ls"}, 60);
  EXPECT_EQ(cli.exit_code, 2) << cli.err;
  RunResult train = RunProgram(GRADSNAP_TRAIN_BIN,
                               {"--steps", "1", "--etcd", "127.0.0.1:2379", "--etcd-user", "u"}, 60);
  EXPECT_EQ(train.exit_code, 2) << train.out << train.err;
}

// etcd with TLS and client certificates required: a node, the CLI, a ClientOptions client and
// gradsnap-train work over https:// with the CA and a client certificate; a wrong CA, no client
// certificate, or plaintext are one line each.
TEST(ClusterEtcdSecurity, TlsWithClientCertificates) {
  TempDir dir("etcd-tls");
  const std::string pki = dir.Sub("pki");
  ASSERT_TRUE(MakeTlsMaterial(pki).ok());
  auto pem = [&](const char* name) { return absl::StrCat(pki, "/", name); };
  EtcdCluster etcd(dir.Sub("etcd"));
  etcd.set_tls({.ca = pem("ca.pem"), .cert = pem("server.pem"), .key = pem("server.key"),
                .client_ca = pem("ca.pem"), .client_cert = pem("client.pem"),
                .client_key = pem("client.key")});
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  const std::string url = "https://" + etcd.Endpoint(0);
  const std::vector<std::string> good = {"--etcd-ca", pem("ca.pem"), "--etcd-cert",
                                         pem("client.pem"), "--etcd-key", pem("client.key")};

  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(GRADSNAP_SERVER_BIN));
    auto address = StartClusterNode(servers.back().get(), dir.File(absl::StrCat("node", i)),
                                    url, good);
    ASSERT_TRUE(address.ok()) << address.status();
  }
  client::ClientOptions o;
  o.etcd = url;
  o.etcd_tls = {.cert_file = pem("client.pem"), .key_file = pem("client.key"),
                .ca_file = pem("ca.pem")};
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  SaveAndRestore(c->get(), "tls-job");

  std::vector<std::string> ls = {"--etcd", url};
  ls.insert(ls.end(), good.begin(), good.end());
  ls.insert(ls.end(), {"ls", "tls-job"});
  RunResult r = RunProgram(GRADSNAP_CLI_BIN, ls, 60);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("committed"), std::string::npos) << r.out;

  std::vector<std::string> train = {"--model", "tiny", "--steps", "4", "--batch", "8",
                                    "--ckpt-mode", "sync", "--ckpt-every", "2", "--job", "tj",
                                    "--replicas", "2", "--etcd", url};
  train.insert(train.end(), good.begin(), good.end());
  r = RunProgram(GRADSNAP_TRAIN_BIN, train, 300);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(SummaryField(r.out, "recovery_point"), "4") << r.out;

  // Refused: the wrong CA, no client certificate, plaintext towards the TLS port.
  const std::string data = dir.File("refused");
  ExpectOneLine(ServerThatFails(data, {"--etcd", url, "--etcd-ca", pem("other-ca.pem"),
                                       "--etcd-cert", pem("client.pem"), "--etcd-key",
                                       pem("client.key")}),
                1, "over TLS");
  ExpectOneLine(ServerThatFails(data, {"--etcd", url, "--etcd-ca", pem("ca.pem")}), 1,
                "etcd unreachable");
  ExpectOneLine(ServerThatFails(data, {"--etcd", etcd.Endpoint(0)}), 1, "etcd unreachable");
  ExpectOneLine(ServerThatFails(data, {"--etcd", url, "--etcd-ca", dir.File("none.pem")}), 1,
                "none.pem");
  std::vector<std::string> bad_ls = {"--etcd", url, "--etcd-ca", pem("other-ca.pem"), "ls"};
  r = RunProgram(GRADSNAP_CLI_BIN, bad_ls, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(CountLines(r.err), 1) << r.err;
}

// etcd with authentication on (a root user, and user gradsnap with read-write on /gradsnap/):
// a node with --etcd-user and --etcd-password-file, the CLI with $GRADSNAP_ETCD_PASSWORD and a
// ClientOptions client work; a wrong password or no user is one line.
TEST(ClusterEtcdSecurity, UserAndPassword) {
  TempDir dir("etcd-auth");
  EtcdCluster etcd(dir.Sub("etcd"));
  ASSERT_TRUE(etcd.Start(1).ok()) << etcd.Log(0);
  for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
           {"user", "add", "root:rootpw"},
           {"user", "add", "gradsnap:s3cret-pw"},
           {"role", "add", "gs"},
           {"role", "grant-permission", "gs", "--prefix=true", "readwrite", "/gradsnap/"},
           {"user", "grant-role", "gradsnap", "gs"},
           {"auth", "enable"}}) {
    RunResult r = etcd.Ctl(0, cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd[0] << " " << cmd[1] << ": " << r.out << r.err;
  }
  etcd.set_ctl_user("root:rootpw");
  const std::string password_file = dir.File("etcd-password");
  { std::ofstream(password_file) << "s3cret-pw\n"; }
  const std::string wrong_file = dir.File("wrong-password");
  { std::ofstream(wrong_file) << "guess\n"; }

  ServerProcess server(GRADSNAP_SERVER_BIN);
  auto address = StartClusterNode(&server, dir.File("node"), etcd.Endpoints(),
                                  {"--etcd-user", "gradsnap", "--etcd-password-file",
                                   password_file, "--lease-ttl-s", "2"});
  ASSERT_TRUE(address.ok()) << address.status();
  client::ClientOptions o;
  o.etcd = etcd.Endpoints();
  o.cluster_replicas = 1;
  o.min_replicas = 1;
  o.etcd_user = "gradsnap";
  o.etcd_password = "s3cret-pw";
  auto c = client::Client::ConnectRemote(o);
  ASSERT_TRUE(c.ok()) << c.status();
  SaveAndRestore(c->get(), "auth-job");

  // The password from the environment (the CLI's child only).
  RunResult r = RunCommand(absl::StrCat(cluster::kEtcdPasswordEnv, "=s3cret-pw ", GRADSNAP_CLI_BIN,
                                        " --etcd ", etcd.Endpoints(),
                                        " --etcd-user gradsnap ls auth-job"),
                           60);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("committed"), std::string::npos) << r.out;

  const std::string data = dir.File("refused");
  ExpectOneLine(ServerThatFails(data, {"--etcd", etcd.Endpoints(), "--etcd-user", "gradsnap",
                                       "--etcd-password-file", wrong_file}),
                1, "authentication failed");
  ExpectOneLine(ServerThatFails(data, {"--etcd", etcd.Endpoints()}), 1, "etcd");
  o.etcd_password = "guess";
  auto refused = client::Client::ConnectRemote(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("authentication failed"), absl::string_view::npos)
      << refused.status();
  // The node's token lives on across etcd's restart (etcd forgets simple tokens: the node
  // authenticates again) and it keeps its lease.
  ASSERT_TRUE(etcd.Restart(0).ok()) << etcd.Log(0);
  o.etcd_password = "s3cret-pw";
  auto again = client::Client::ConnectRemote(o);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(WaitFor([&] { return (*again)->Health().ok(); }, 30)) << server.Log();
  client::CheckpointSpec spec = FullSpec("auth-job", 2, 1);
  spec.epoch = *(*again)->AcquireEpoch("auth-job");
  absl::Status begun;
  EXPECT_TRUE(WaitFor([&] { return (begun = (*again)->BeginCheckpoint(spec)).ok(); }, 30))
      << begun;
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
