// gradsnap-server: the storage node (DESIGN.md section 6, docs/protocol.md).
//
// Flags come from the command line and from --config FILE (`key = value` lines, docs/deploy.md);
// the command line wins. A bad flag, key or value: one line on stderr, exit 2.
// Prints exactly one line "gradsnap-server listening on HOST:PORT" on stdout when ready; a node
// below its catalog's free-space reserve adds " (writes refused: ...)" after the address.
// SIGTERM or SIGINT: stop accepting, let running calls finish (up to --shutdown-grace-ms),
// close the engine, exit 0.
#include <signal.h>

#include <cstdio>
#include <algorithm>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/token.h"
#include "service/server.h"
#include "storage/rebuild.h"

ABSL_FLAG(std::string, config, "",
          "Config file: one flag per line as `key = value` (the flag's name without dashes), "
          "'#' comments; flags on the command line override it (docs/deploy.md). Default: none.");
ABSL_FLAG(std::string, data_dir, "", "Directory of the storage engine (created if missing). Required.");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "HOST:PORT to serve gRPC on; port 0 picks a free one.");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain; with --tls-key enables TLS. Default: plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA that client certificates must chain to (mutual TLS). Default: off.");
ABSL_FLAG(std::string, auth_secret_file, "", "File with the token secret (>= 16 bytes). Default: none, the server runs open.");
ABSL_FLAG(uint64_t, cache_bytes, 0, "RAM tier: bytes of recent checkpoints kept in memory. Default: 0 (off).");
ABSL_FLAG(uint64_t, max_inflight_bytes, 256u << 20, "Cap on upload bytes held in memory. Default: 268435456.");
ABSL_FLAG(std::string, metrics_listen, "", "HOST:PORT for Prometheus metrics over HTTP. Default: off.");
ABSL_FLAG(int, shutdown_grace_ms, 10000, "On SIGTERM, how long running calls may finish. Default: 10000.");
ABSL_FLAG(int, stream_idle_ms, 120000,
          "Cancel an upload or download whose client does nothing for this long (sends no "
          "message, takes no message: a live client gone silent); 0: off. Default: 120000.");
ABSL_FLAG(int, keepalive_ms, 30000,
          "Ping clients with calls in flight this often; a connection whose ping goes "
          "unanswered for a third of it (at least 1 s) is closed, so a frozen or cut-off client "
          "frees its upload. 0: off. Default: 30000.");
ABSL_FLAG(int, prefault_uploads, gradsnap::service::ServerOptions::kPrefaultUploads,
          "Uploads whose record buffers are faulted in at start (6 x 4 MiB each; 0: on first use). Default: 2.");
ABSL_FLAG(bool, prefault_read_ahead, true,
          "Fault in at start the record buffers restores read ahead into (32 x 4 MiB), so the first restore after a start does not zero fresh pages. Default: true.");
ABSL_FLAG(int, zstd_level, 1, "zstd level of stored chunks; 0 stores raw. Default: 1.");
ABSL_FLAG(int, durable_every_mib, 64, "An upload is made durable every N MiB received (a crash resends at most that). Default: 64.");
ABSL_FLAG(std::string, digest, "xxh3", "Per-tensor digest of new shards: xxh3 (XXH3-128) or sha256. Default: xxh3.");
ABSL_FLAG(bool, rebuild_catalog, false,
          "Rebuild the catalog (meta/) of --data-dir from the shard footers in its segments, "
          "print what was restored and skipped, and exit (0 on success). Default: false.");
ABSL_FLAG(uint64_t, catalog_reserve_bytes, 16 << 20,
          "Free space kept for the catalog: below it writes get RESOURCE_EXHAUSTED (a server "
          "started below it serves reads, rm and gc, and takes writes once space is back); "
          "0 disables. Default: 16777216.");
ABSL_FLAG(int64_t, quarantine_grace_seconds, 7 * 24 * 3600,
          "GC removes quarantine/ entries older than this. Default: 604800 (7 days).");

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gradsnap-server: %s\n", msg.c_str());
  return 1;
}

// A flag value the server cannot use (also from --config): exit 2, like an unknown flag.
int BadFlag(const std::string& msg) {
  std::fprintf(stderr, "gradsnap-server: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  gradsnap::CommandLine command_line(  // --data-dir is --data_dir
      argc, argv,
      "gradsnap-server [--config FILE] --data-dir DIR --listen HOST:PORT [--tls-cert F --tls-key F "
      "[--tls-client-ca F]] [--auth-secret-file F] [--cache-bytes N] [--max-inflight-bytes N] "
      "[--metrics-listen HOST:PORT] [--rebuild-catalog]\nFlags may be spelled with dashes or underscores.",
      {"server_main"});
  // gRPC's receive buffers stay warm, large buffers are mapped apart, few arenas for the many
  // gRPC threads (common/malloc_tuning.h).
  gradsnap::TuneMallocForStreaming(/*few_arenas=*/true);
  const std::vector<char*> positional = command_line.Parse(/*bad_flag_exit=*/2, "config");
  // A word without a flag (a value whose flag was forgotten, "--listen" left out) is an error,
  // not ignored: the server would start somewhere else than meant.
  if (positional.size() > 1) {
    return BadFlag(std::string("unexpected argument: ") + positional[1] + " (see --help)");
  }
  // Block the stop signals in every thread (gRPC's included); main waits for them below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  gradsnap::service::ServerOptions o;
  o.engine.data_dir = absl::GetFlag(FLAGS_data_dir);
  if (o.engine.data_dir.empty()) return BadFlag("--data-dir is required (see --help)");
  o.engine.zstd_level = absl::GetFlag(FLAGS_zstd_level);
  o.engine.prefault_writers = absl::GetFlag(FLAGS_prefault_uploads);
  if (o.engine.prefault_writers < 0 || o.engine.prefault_writers > 10) {
    return BadFlag("--prefault-uploads must be 0..10");
  }
  o.engine.prefault_read_ahead = absl::GetFlag(FLAGS_prefault_read_ahead);
  const int durable_mib = absl::GetFlag(FLAGS_durable_every_mib);
  if (durable_mib < 1 || durable_mib > 4096) return BadFlag("--durable-every-mib must be 1..4096");
  o.service.flush_bytes = static_cast<uint64_t>(durable_mib) << 20;
  if (!gradsnap::ParseDigestAlgo(absl::GetFlag(FLAGS_digest), &o.engine.digest)) {
    return BadFlag("--digest must be xxh3 or sha256");
  }
  o.engine.quarantine_grace_seconds = absl::GetFlag(FLAGS_quarantine_grace_seconds);
  o.engine.catalog_reserve_bytes = absl::GetFlag(FLAGS_catalog_reserve_bytes);
  if (o.engine.quarantine_grace_seconds < 0) {
    return BadFlag("--quarantine-grace-seconds must be >= 0");
  }
  if (absl::GetFlag(FLAGS_rebuild_catalog)) {
    auto report = gradsnap::storage::RebuildCatalog(o.engine, /*dry_run=*/false);
    if (!report.ok()) return Fail(std::string(report.status().message()));
    for (const std::string& r : report->from_quarantine) std::printf("%s\n", r.c_str());
    for (const std::string& r : report->rebuilt) std::printf("rebuilt %s\n", r.c_str());
    for (const std::string& r : report->skipped) std::printf("skipped %s\n", r.c_str());
    for (const std::string& r : report->epochs) std::printf("epoch %s\n", r.c_str());
    if (!report->old_catalog.empty()) {
      std::printf("previous catalog kept as %s\n", report->old_catalog.c_str());
    }
    std::printf("catalog rebuilt: %zu checkpoints, %zu skipped\n", report->rebuilt.size(),
                report->skipped.size());
    return 0;
  }
  o.listen = absl::GetFlag(FLAGS_listen);
  o.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls.ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.cache_bytes = absl::GetFlag(FLAGS_cache_bytes);
  o.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  o.keepalive_ms = absl::GetFlag(FLAGS_keepalive_ms);
  if (o.keepalive_ms < 0) return BadFlag("--keepalive-ms must be >= 0");
  o.service.stream_idle_ms = absl::GetFlag(FLAGS_stream_idle_ms);
  if (o.service.stream_idle_ms < 0) return BadFlag("--stream-idle-ms must be >= 0");
  if (absl::GetFlag(FLAGS_shutdown_grace_ms) < 0) {
    return BadFlag("--shutdown-grace-ms must be >= 0");
  }
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!absl::GetFlag(FLAGS_auth_secret_file).empty()) {
    auto secret = gradsnap::ReadSecretFile(absl::GetFlag(FLAGS_auth_secret_file));
    if (!secret.ok()) return Fail(std::string(secret.status().message()));
    o.auth_secret = *std::move(secret);
  }
  auto server = gradsnap::service::Server::Start(o);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  if ((*server)->metrics_port() != 0) {
    GS_LOG(INFO) << "metrics on port " << (*server)->metrics_port();
  }
  // A node below its catalog's reserve says so after the address (docs/protocol.md).
  std::string note = (*server)->engine()->WriteSpace().Note();
  if (!note.empty()) note = absl::StrCat(" (", note, ")");
  std::printf("gradsnap-server listening on %s%s\n", (*server)->address().c_str(), note.c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  GS_LOG(INFO) << "signal " << sig << ": shutting down";
  (*server)->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server->reset();
  GS_LOG(INFO) << "stopped";
  return 0;
}
