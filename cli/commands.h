// The commands of the gradsnap CLI (docs/cli.md). Each command prints its result on stdout
// (a table, or JSON with --json) and returns a Status; gradsnap_main.cc turns a non-OK status
// into a one-line error and an exit code.
#ifndef GRADSNAP_CLI_COMMANDS_H_
#define GRADSNAP_CLI_COMMANDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/args.h"
#include "client/client.h"
#include "recovery/recovery_point.h"

namespace gradsnap {
namespace cli {

// Exit codes (docs/cli.md).
constexpr int kExitOk = 0;
constexpr int kExitError = 1;      // any other failure (I/O, server unavailable, ...)
constexpr int kExitUsage = 2;      // bad command line, bad names or values (INVALID_ARGUMENT)
constexpr int kExitDataLoss = 3;   // DATA_LOSS: corruption found (verify), unreadable data
constexpr int kExitNotFound = 4;   // NOT_FOUND: no such job, step, rank or directory

// Per-invocation state shared by the commands.
struct Context {
  ParsedArgs args;
  bool json = false;      // --json
  bool progress = false;  // draw progress bars (stderr is a terminal and not --json)
  client::ClientOptions options;
  std::unique_ptr<client::Client> client;

  // Connects on first use (embedded: the directory must already exist).
  absl::StatusOr<client::Client*> Connect();
};

struct Command {
  std::string name;
  std::string usage;     // e.g. "ls [JOB]"
  std::string summary;   // one line
  std::string details;   // extra help text, may be empty
  std::vector<FlagSpec> flags;
  int min_args = 0;
  int max_args = 0;
  absl::Status (*run)(Context& ctx) = nullptr;
};

const std::vector<Command>& Commands();
const std::vector<FlagSpec>& GlobalFlags();
const Command* FindCommand(const std::string& name);

// Commands, in commands_read.cc, commands_data.cc, commands_admin.cc.
absl::Status RunLs(Context& ctx);
absl::Status RunShow(Context& ctx);
absl::Status RunHealth(Context& ctx);
absl::Status RunVerify(Context& ctx);
absl::Status RunRestore(Context& ctx);
absl::Status RunExport(Context& ctx);
absl::Status RunRm(Context& ctx);
absl::Status RunGc(Context& ctx);
absl::Status RunToken(Context& ctx);
absl::Status RunFsck(Context& ctx);  // commands_fsck.cc

// Restore and export of stored shards as they are (commands_data.cc); RunRestore and RunExport
// (commands_restore.cc) use them when nothing needs replaying or re-cutting.
absl::Status RestoreRaw(Context& ctx, const std::string& job, int64_t step);
absl::Status ExportRaw(Context& ctx, const std::string& job, int64_t step);
// Creates `dir` and its parents where missing; a failure keeps the system's reason (EROFS:
// PERMISSION_DENIED, ENOTDIR: FAILED_PRECONDITION, ...), naming `dir`.
absl::Status CreateDirectories(const std::string& dir);
// The files an export of `world_size` ranks to `file` (only `rank` where >= 0) writes, each
// checked by client::CheckOutputFile, `file` itself too: before anything is read.
absl::Status CheckExportNames(const std::string& file, int32_t world_size, int rank);
// The same for the files a restore writes into `dir`: rank<R>.safetensors (only `rank` where
// >= 0) of `world_size` ranks, or with `consolidated` the consolidated files.
absl::Status CheckRestoreNames(const std::string& dir, int32_t world_size, int rank,
                               bool consolidated);

// Helpers shared by the commands.
absl::Status CheckJob(const std::string& job);
// A step number, or "latest" when allow_latest: the step of the job's recovery point (newest
// FULL + its DELTA chain, recovery/recovery_point.h), or the newest committed checkpoint of a
// job without FULLs. For "latest", *rp (when not null) receives the recovery point found in
// the one listing of the job.
absl::StatusOr<int64_t> ResolveStep(Context& ctx, const std::string& job, const std::string& arg,
                                    bool allow_latest, recovery::RecoveryPoint* rp = nullptr);
// The job's recovery point (full_step -1 when it has no committed FULL).
absl::StatusOr<recovery::RecoveryPoint> JobRecoveryPoint(Context& ctx, const std::string& job);
// The steps of the recovery point: its FULL, then its DELTAs. NOT_FOUND when there is none.
absl::StatusOr<std::vector<int64_t>> RecoveryPointSteps(Context& ctx, const std::string& job);
std::string KindName(client::CheckpointKind k);
std::string StateName(client::CheckpointState s);
// JSON of a checkpoint's info (no shards), and of a whole manifest.
std::string CheckpointJson(const client::CheckpointInfo& c);
std::string ManifestJson(const client::Manifest& m);
// Writes `text` to stdout.
void Print(const std::string& text);

}  // namespace cli
}  // namespace gradsnap

#endif  // GRADSNAP_CLI_COMMANDS_H_
