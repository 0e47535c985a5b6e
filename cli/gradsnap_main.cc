// gradsnap: the command-line tool for gradsnap checkpoints (docs/cli.md).
//
//   gradsnap [--server H:P[,H:P...] | --ckpt-dir DIR] [--token T | --token-file F]
//            [--tls-ca F] [--json] COMMAND [ARGS]
//
// Errors are one line on stderr ("gradsnap: <reason>") with the exit codes of commands.h.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/commands.h"
#include "cluster/etcd_client.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/small_file.h"
#include "common/status.h"
#include "storage/file_system.h"

namespace gradsnap {
namespace cli {
namespace {

// A token is a few hundred bytes; the bound turns /dev/zero or a log file into an error.
constexpr size_t kMaxTokenFileBytes = 64 << 10;

const std::vector<FlagSpec>* CommandFlags(const std::string& command) {
  const Command* c = FindCommand(command);
  return c == nullptr ? nullptr : &c->flags;
}

std::string FlagLines(const std::vector<FlagSpec>& flags) {
  std::string out;
  for (const FlagSpec& f : flags) {
    std::string left = absl::StrCat("  --", f.name, f.value.empty() ? "" : " " + f.value);
    if (left.size() < 28) left.resize(28, ' ');
    else left += "  ";
    absl::StrAppend(&out, left, f.help, "\n");
  }
  return out;
}

std::string MainHelp() {
  std::string out =
      "usage: gradsnap [GLOBAL FLAGS] COMMAND [ARGS] [COMMAND FLAGS]\n\n"
      "Inspect, verify, restore and export gradsnap checkpoints, on gradsnap-server nodes\n"
      "(--server) or in an embedded engine directory (--ckpt-dir, default ./checkpoints).\n\n"
      "commands:\n";
  for (const Command& c : Commands()) {
    absl::StrAppend(&out, "  ", c.usage, "\n      ", c.summary, "\n");
  }
  absl::StrAppend(&out, "\nglobal flags (before or after the command):\n",
                  FlagLines(GlobalFlags()),
                  "  --help                    this help; 'gradsnap COMMAND --help' for one "
                  "command\n\nexit status: 0 ok, 1 error, 2 usage or invalid argument, 3 data "
                  "loss (corruption), 4 not found\n");
  return out;
}

std::string CommandHelp(const Command& c) {
  std::string out = absl::StrCat("usage: gradsnap [GLOBAL FLAGS] ", c.usage, "\n\n", c.summary,
                                 ".\n");
  if (!c.details.empty()) absl::StrAppend(&out, c.details, "\n");
  if (!c.flags.empty()) absl::StrAppend(&out, "\nflags:\n", FlagLines(c.flags));
  absl::StrAppend(&out, "\nglobal flags:\n", FlagLines(GlobalFlags()));
  return out;
}

int ExitCodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return kExitOk;
    case absl::StatusCode::kInvalidArgument: return kExitUsage;
    case absl::StatusCode::kDataLoss: return kExitDataLoss;
    case absl::StatusCode::kNotFound: return kExitNotFound;
    default: return kExitError;
  }
}

absl::Status BuildOptions(Context& ctx) {
  const ParsedArgs& a = ctx.args;
  client::ClientOptions& o = ctx.options;
  if (a.Has("server")) {
    for (absl::string_view ep : absl::StrSplit(a.Get("server"), ',', absl::SkipWhitespace())) {
      o.endpoints.emplace_back(absl::StripAsciiWhitespace(ep));
    }
    if (o.endpoints.empty()) return absl::InvalidArgumentError("--server needs H:P[,H:P...]");
    if (a.Has("ckpt-dir")) {
      return absl::InvalidArgumentError("give --server or --ckpt-dir, not both");
    }
  }
  if (a.Has("etcd")) {
    if (a.Has("server") || a.Has("ckpt-dir")) {
      return absl::InvalidArgumentError("give one of --etcd, --server and --ckpt-dir");
    }
    o.etcd = a.Get("etcd");
    if (o.etcd.empty()) return absl::InvalidArgumentError("--etcd needs H:P[,H:P...]");
    ASSIGN_OR_RETURN(const cluster::EtcdOptions eo,
                     cluster::EtcdOptionsFromFlags(
                         o.etcd,
                         {.cert_file = a.Get("etcd-cert"), .key_file = a.Get("etcd-key"),
                          .ca_file = a.Get("etcd-ca")},
                         a.Get("etcd-user"), a.Get("etcd-password-file")));
    o.etcd_tls = eo.tls_files;
    o.etcd_user = eo.user;
    o.etcd_password = eo.password;
  } else {
    for (const char* cluster_only :
         {"min-replicas", "etcd-ca", "etcd-cert", "etcd-key", "etcd-user", "etcd-password-file"}) {
      if (a.Has(cluster_only)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", cluster_only, " applies to --etcd (cluster mode) only"));
      }
    }
  }
  if (o.etcd.empty()) o.local_dir = a.Get("ckpt-dir", "./checkpoints");
  if (o.endpoints.empty() && o.etcd.empty()) {  // server-only flags: never silently ignored
    for (const char* remote_only : {"tls-ca", "tls-cert", "tls-key", "replicas"}) {
      if (a.Has(remote_only)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", remote_only, " applies to --server connections only"));
      }
    }
  }
  if (a.Has("token") && a.Has("token-file")) {
    return absl::InvalidArgumentError("give --token or --token-file, not both");
  }
  o.token = a.Get("token");
  if (a.Has("token-file")) {
    ASSIGN_OR_RETURN(std::string token,
                     ReadSmallFile(a.Get("token-file"), "--token-file", kMaxTokenFileBytes));
    o.token = std::string(absl::StripAsciiWhitespace(token));
  }
  // Commands that only read open an embedded store read-only (RocksDB OpenForReadOnly): they
  // work on a full or read-only file system, next to a running trainer, and never create a
  // store in a directory that has none.
  static const std::set<std::string> kReadOnly = {"ls", "show", "health", "verify", "restore",
                                                  "export"};
  o.read_only = kReadOnly.count(a.command) != 0;
  // rm and gc change a store but never make one: a directory without a store (no meta/ and no
  // segments/) is NOT_FOUND, as for the reading commands.
  if (o.endpoints.empty() && o.etcd.empty() && (a.command == "rm" || a.command == "gc")) {
    std::error_code ec;
    if (!std::filesystem::exists(o.local_dir + "/meta", ec) &&
        !std::filesystem::exists(o.local_dir + "/segments", ec)) {
      return absl::NotFoundError(absl::StrCat("no gradsnap checkpoint store in ", o.local_dir));
    }
  }
  o.tls.ca_file = a.Get("tls-ca");
  o.tls.cert_file = a.Get("tls-cert");
  o.tls.key_file = a.Get("tls-key");
  const bool cluster = !o.etcd.empty();
  ASSIGN_OR_RETURN(int64_t replicas,
                   ParseInt(a.Get("replicas", cluster ? "3" : "1"), 1, 16, "--replicas"));
  o.replicas = static_cast<int>(replicas);
  o.cluster_replicas = static_cast<int>(replicas);
  ASSIGN_OR_RETURN(int64_t min_replicas,
                   ParseInt(a.Get("min-replicas", "2"), 1, 16, "--min-replicas"));
  o.min_replicas = static_cast<int>(min_replicas);
  // Fewer tries than the library default: an operator at a terminal wants a dead server
  // reported in about a second, not after the trainer-oriented backoff.
  ASSIGN_OR_RETURN(int64_t attempts, ParseInt(a.Get("attempts", "5"), 1, 100, "--attempts"));
  o.max_attempts = static_cast<int>(attempts);
  ctx.json = a.Has("json");
  ctx.progress = !ctx.json && ::isatty(STDERR_FILENO);
  return absl::OkStatus();
}

int UsageError(const std::string& msg, const std::string& command) {
  std::string hint = command.empty() ? "gradsnap --help" : "gradsnap " + command + " --help";
  std::fprintf(stderr, "gradsnap: %s (see '%s')\n", msg.c_str(), hint.c_str());
  return kExitUsage;
}

// SIGINT, SIGTERM and SIGHUP end the command as they would by default, but first remove the
// unfinished temporaries it was writing (an export's or a restore's "NAME.tmp-PID-N", which
// can be gigabytes): one thread waits for them, blocked in every other thread. Call before any
// thread starts (each inherits the mask).
void StartInterruptHandler() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;
  std::thread([set] {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) return;
    const int removed = storage::RemoveOwnTempFiles();
    std::string line = absl::StrCat("gradsnap: interrupted by ", ::strsignal(sig));
    if (removed > 0) {
      absl::StrAppend(&line, "; removed ", removed, " unfinished temporary file",
                      removed == 1 ? "" : "s");
    }
    line += "\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
    ::_exit(128 + sig);
  }).detach();
}

int Main(int argc, char** argv) {
  StartInterruptHandler();
  if (std::getenv("GRADSNAP_LOG_LEVEL") == nullptr) SetLogLevel(LogLevel::kWarning);
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(argc, argv, GlobalFlags(), CommandFlags);
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()), "");
  Context ctx;
  ctx.args = *std::move(parsed);
  const Command* cmd = ctx.args.command.empty() ? nullptr : FindCommand(ctx.args.command);
  if (ctx.args.command.empty()) {
    if (ctx.args.help) {
      std::fputs(MainHelp().c_str(), stdout);
      return kExitOk;
    }
    return UsageError("no command given", "");
  }
  if (cmd == nullptr) return UsageError("unknown command '" + ctx.args.command + "'", "");
  if (ctx.args.help) {
    std::fputs(CommandHelp(*cmd).c_str(), stdout);
    return kExitOk;
  }
  int n = static_cast<int>(ctx.args.positional.size());
  if (n < cmd->min_args || n > cmd->max_args) {
    return UsageError(absl::StrCat("wrong number of arguments; usage: gradsnap ", cmd->usage),
                      cmd->name);
  }
  absl::Status st = BuildOptions(ctx);
  if (st.ok()) st = cmd->run(ctx);
  std::fflush(stdout);
  if (st.ok()) return kExitOk;
  // Bad input (a value out of range, flags that do not go together, a bad job name or
  // endpoint) is a usage error, whichever layer found it: said as one, with the command's help.
  if (absl::IsInvalidArgument(st)) return UsageError(std::string(st.message()), cmd->name);
  std::fprintf(stderr, "gradsnap: %s: %s\n", absl::StatusCodeToString(st.code()).c_str(),
               std::string(st.message()).c_str());
  return ExitCodeOf(st);
}

}  // namespace
}  // namespace cli
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::TuneMallocForStreaming(/*few_arenas=*/false);  // restores stream gigabytes
  return gradsnap::cli::Main(argc, argv);
}
