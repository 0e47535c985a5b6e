// gradsnap-server: the storage node (DESIGN.md section 6, docs/protocol.md).
//
// Flags come from the command line and from --config FILE (`key = value` lines, docs/deploy.md);
// the command line wins. A bad flag, key or value: one line on stderr, exit 2.
// Prints exactly one line "gradsnap-server listening on HOST:PORT" on stdout when ready; a node
// below its catalog's free-space reserve adds " (writes refused: ...)" after the address.
// SIGTERM or SIGINT: stop accepting, let running calls finish (up to --shutdown-grace-ms),
// close the engine, exit 0.
#include <signal.h>
#include <sys/statvfs.h>

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cluster_repair.h"
#include "cluster/etcd_client.h"
#include "cluster/etcd_flags.h"
#include "cluster/membership.h"
#include "cluster/node_id.h"
#include "common/digest.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/malloc_tuning.h"
#include "common/token.h"
#include "proto/tls.h"
#include "service/orphan_sweep.h"
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
ABSL_FLAG(bool, test_no_pull_copy, false,
          "Testing: answer PullCopy UNIMPLEMENTED, as a server from before it does (the "
          "repairer then relays its copies to this node). Default: false.");
ABSL_FLAG(bool, rebuild_catalog, false,
          "Rebuild the catalog (meta/) of --data-dir from the shard footers in its segments, "
          "print what was restored and skipped, and exit (0 on success). Default: false.");
ABSL_FLAG(uint64_t, catalog_reserve_bytes, 16 << 20,
          "Free space kept for the catalog: below it writes get RESOURCE_EXHAUSTED (a server "
          "started below it serves reads, rm and gc, and takes writes once space is back); "
          "0 disables. Default: 16777216.");
ABSL_FLAG(std::string, etcd, "",
          "Cluster mode: the etcd endpoints [http://]HOST:PORT[,...]; the node registers there "
          "under a lease and takes writes only while it holds it (docs/protocol.md, \"Cluster "
          "mode\"). Default: empty (single node).");
ABSL_FLAG(std::string, advertise, "",
          "Cluster mode: the HOST:PORT clients reach this node at, registered in etcd. "
          "Required with --etcd.");
ABSL_FLAG(int, lease_ttl_s, 10,
          "Cluster mode: TTL in seconds of the node's etcd lease, renewed every third of it; a "
          "node that cannot renew it for this long refuses writes (2..3600). Default: 10.");
ABSL_FLAG(absl::Duration, repair_after, absl::Minutes(10),
          "Cluster mode: a committed shard with fewer live copies than its record's replicas is "
          "re-replicated by the cluster's repairer (one node, elected in etcd) once a copy has "
          "been missing this long, e.g. 30s, 10m (docs/protocol.md, \"Repair\"); >= 1s. "
          "Default: 10m.");
ABSL_FLAG(absl::Duration, orphan_grace, absl::Hours(1),
          "Cluster mode: a copy on this node that no etcd record names (its checkpoint deleted "
          "or repaired elsewhere while the node was away) is moved to quarantine/ after being "
          "seen unnamed this long, e.g. 30m; >= 1s. Default: 1h.");
ABSL_FLAG(uint64_t, repair_bandwidth_mib_s, 0,
          "Cluster mode: cap on the MiB per second each repair copy made by this node (the "
          "copy's target) reads from its source; 0: no cap. Default: 0.");
ABSL_FLAG(int, repair_parallel, 4,
          "Cluster mode: ranks the repairer (while this node is it) repairs at once, 1..64; a "
          "node takes at most 2 copies at a time. Default: 4.");
// The node's credentials towards the other nodes (docs/deploy.md, "Node credentials").
ABSL_FLAG(std::string, peer_tls_ca, "", "Cluster mode: PEM CA of the other nodes' certificates "
          "(TLS between nodes; required with --tls-cert). Default: none, plaintext.");
ABSL_FLAG(std::string, peer_tls_cert, "", "Cluster mode: PEM client certificate for nodes with "
          "--tls-client-ca. Default: --tls-cert.");
ABSL_FLAG(std::string, peer_tls_key, "", "Cluster mode: the key of --peer-tls-cert. Default: --tls-key.");
ABSL_FLAG(int64_t, quarantine_grace_seconds, 7 * 24 * 3600,
          "GC removes quarantine/ entries older than this. Default: 604800 (7 days).");

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gradsnap-server: %s\n", msg.c_str());
  return 1;
}

// The cluster-mode flags, checked before anything starts.
struct ClusterFlags {
  gradsnap::cluster::EtcdOptions etcd;  // endpoints empty: single node
  std::string advertise;
  int lease_ttl_s = 10;
  absl::Duration repair_after;
  int repair_parallel = 4;  // ranks repaired at once (--repair-parallel)
  absl::Duration orphan_grace;
  // How the repairer reaches the other nodes (--peer-tls-*; docs/deploy.md, "Node credentials").
  gradsnap::TlsFiles peer_tls;
};

// The --peer-tls-* flags: "" when usable (with the defaults from --tls-cert/--tls-key filled
// in), else the one line saying what is wrong.
std::string ParsePeerTlsFlags(bool cluster, gradsnap::TlsFiles* out) {
  out->ca_file = absl::GetFlag(FLAGS_peer_tls_ca);
  out->cert_file = absl::GetFlag(FLAGS_peer_tls_cert);
  out->key_file = absl::GetFlag(FLAGS_peer_tls_key);
  const bool any = !out->ca_file.empty() || !out->cert_file.empty() || !out->key_file.empty();
  if (any && !cluster) return "--peer-tls-ca, --peer-tls-cert and --peer-tls-key need --etcd (cluster mode)";
  if (out->cert_file.empty() != out->key_file.empty()) {
    return "--peer-tls-cert and --peer-tls-key go together";
  }
  if (!out->cert_file.empty() && out->ca_file.empty()) return "--peer-tls-cert needs --peer-tls-ca";
  if (cluster && !absl::GetFlag(FLAGS_tls_cert).empty() && out->ca_file.empty()) {
    return "--tls-cert in cluster mode needs --peer-tls-ca F (the CA of the other nodes' "
           "certificates: the repairer copies between nodes over TLS)";
  }
  if (!out->ca_file.empty() && out->cert_file.empty()) {
    out->cert_file = absl::GetFlag(FLAGS_tls_cert);
    out->key_file = absl::GetFlag(FLAGS_tls_key);
  }
  return "";
}

// "" when the flags are usable, else the one line saying what is wrong.
std::string ParseClusterFlags(ClusterFlags* out) {
  const std::string etcd = absl::GetFlag(FLAGS_etcd);
  out->advertise = absl::GetFlag(FLAGS_advertise);
  out->lease_ttl_s = absl::GetFlag(FLAGS_lease_ttl_s);
  if (etcd.empty() && !out->advertise.empty()) return "--advertise needs --etcd (cluster mode)";
  auto options = gradsnap::cluster::EtcdOptionsFromCommandLine(etcd);
  if (!options.ok()) return std::string(options.status().message());
  out->etcd = *std::move(options);
  if (std::string bad = ParsePeerTlsFlags(!etcd.empty(), &out->peer_tls); !bad.empty()) {
    return bad;
  }
  if (etcd.empty()) return "";
  if (out->advertise.empty()) return "--etcd needs --advertise HOST:PORT (how clients reach this node)";
  const size_t colon = out->advertise.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(out->advertise).substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return "--advertise \"" + out->advertise + "\" is not HOST:PORT (PORT 1..65535)";
  }
  if (out->lease_ttl_s < 2 || out->lease_ttl_s > 3600) return "--lease-ttl-s must be 2..3600";
  out->repair_after = absl::GetFlag(FLAGS_repair_after);
  if (out->repair_after < absl::Seconds(1)) return "--repair-after must be at least 1s";
  out->repair_parallel = absl::GetFlag(FLAGS_repair_parallel);
  if (out->repair_parallel < 1 || out->repair_parallel > 64) {
    return "--repair-parallel must be 1..64";
  }
  out->orphan_grace = absl::GetFlag(FLAGS_orphan_grace);
  if (out->orphan_grace < absl::Seconds(1)) return "--orphan-grace must be at least 1s";
  return "";
}

// A client of the etcd of --etcd that answered one read: UNAVAILABLE "etcd unreachable ..."
// when no member did.
absl::StatusOr<std::unique_ptr<gradsnap::cluster::EtcdClient>> ConnectEtcd(
    const ClusterFlags& cluster);
// Registers the node (its id `id`, cluster/node_id.h) in etcd under a lease.
absl::Status JoinCluster(const ClusterFlags& cluster, const std::string& data_dir,
                         const std::string& id, gradsnap::cluster::EtcdClient* etcd,
                         std::unique_ptr<gradsnap::cluster::Membership>* membership);

// Capacity and free bytes of the file system holding `dir` (0 when unknown).
void DirSpace(const std::string& dir, uint64_t* capacity, uint64_t* free) {
  struct statvfs st = {};
  if (::statvfs(dir.c_str(), &st) != 0) return;
  *capacity = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
  *free = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

absl::StatusOr<std::unique_ptr<gradsnap::cluster::EtcdClient>> ConnectEtcd(
    const ClusterFlags& cluster) {
  ASSIGN_OR_RETURN(auto etcd, gradsnap::cluster::EtcdClient::Create(cluster.etcd));
  absl::Status probe = etcd->Get(gradsnap::cluster::kNodesPrefix).status();
  if (!probe.ok() && !absl::IsNotFound(probe)) return probe;
  return etcd;
}

absl::Status JoinCluster(const ClusterFlags& cluster, const std::string& data_dir,
                         const std::string& id, gradsnap::cluster::EtcdClient* etcd,
                         std::unique_ptr<gradsnap::cluster::Membership>* membership) {
  gradsnap::cluster::MembershipOptions mo;
  mo.node_id = id;
  mo.address = cluster.advertise;
  mo.ttl_s = cluster.lease_ttl_s;
  mo.space = [data_dir](uint64_t* capacity, uint64_t* free) {
    DirSpace(data_dir, capacity, free);
  };
  ASSIGN_OR_RETURN(*membership, gradsnap::cluster::Membership::Join(etcd, mo));
  GS_LOG(INFO) << "cluster node " << id << " at " << cluster.advertise;
  return absl::OkStatus();
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
      "[--metrics-listen HOST:PORT] [--etcd ENDPOINTS --advertise HOST:PORT [--lease-ttl-s N] "
      "[--repair-after D] [--repair-parallel N] [--peer-tls-ca F [--peer-tls-cert F --peer-tls-key F]] [--etcd-ca F] [--etcd-cert F --etcd-key F] "
      "[--etcd-user U [--etcd-password-file F]]] "
      "[--rebuild-catalog]\nFlags may be spelled with dashes or underscores.",
      {"server_main", "etcd_flags"});
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
  ClusterFlags cluster;
  if (std::string bad = ParseClusterFlags(&cluster); !bad.empty()) return BadFlag(bad);
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
  o.cluster_mode = !cluster.etcd.endpoints.empty();
  if (!cluster.peer_tls.ca_file.empty()) {  // unreadable files: now, not at the first repair
    if (auto pem = gradsnap::proto::ReadTlsPem(cluster.peer_tls); !pem.ok()) {
      return Fail(std::string(pem.status().message()));
    }
  }
  // The node's stable id, made at its first start (cluster/node_id.h): registered in cluster
  // mode, and answered by Health in both modes (static endpoint lists place by it).
  {
    std::error_code ec;  // a missing data directory is made here; the engine checks the rest
    std::filesystem::create_directories(o.engine.data_dir, ec);
    auto id = gradsnap::cluster::LoadOrCreateNodeId(o.engine.data_dir);
    if (!id.ok()) return Fail(std::string(id.status().message()));
    o.service.node_id = *std::move(id);
  }
  // Cluster mode: writes wait for the node's registration and stop whenever its lease lapses.
  std::atomic<const gradsnap::cluster::Membership*> member{nullptr};
  std::unique_ptr<gradsnap::cluster::EtcdClient> etcd;
  if (!cluster.etcd.endpoints.empty()) {
    auto connected = ConnectEtcd(cluster);
    if (!connected.ok()) return Fail(std::string(connected.status().message()));
    etcd = *std::move(connected);
    o.service.write_gate = [&member]() -> absl::Status {
      const gradsnap::cluster::Membership* m = member.load();
      if (m == nullptr) return absl::UnavailableError("node not registered in the cluster yet");
      return m->WritesAllowed();
    };
  }
  // Cluster mode: PullCopy (a repair's copy made node to node) runs on this node's repair
  // worker, shared so that a copy under way keeps it until it ends.
  absl::Mutex puller_mu;
  std::shared_ptr<gradsnap::client::RepairWorker> puller;  // guarded by puller_mu
  if (etcd != nullptr && !absl::GetFlag(FLAGS_test_no_pull_copy)) {
    o.service.pull_copy = [&puller_mu, &puller](const gradsnap::v1::PullCopyRequest& req,
                                               const std::function<bool()>& cancelled)
        -> absl::StatusOr<uint64_t> {
      std::shared_ptr<gradsnap::client::RepairWorker> w;
      {
        absl::MutexLock lock(&puller_mu);
        w = puller;
      }
      if (w == nullptr) return absl::UnavailableError("node not registered in the cluster yet");
      return w->Pull(req.job(), req.step(), req.source_node_id(), req.digest(), req.raw_bytes(),
                     cancelled);
    };
  }
  auto server = gradsnap::service::Server::Start(o);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  std::unique_ptr<gradsnap::cluster::Membership> membership;
  if (etcd != nullptr) {
    absl::Status joined =
        JoinCluster(cluster, o.engine.data_dir, o.service.node_id, etcd.get(), &membership);
    if (joined.ok()) member.store(membership.get());
    if (!joined.ok()) {
      (*server)->Shutdown(absl::ZeroDuration());
      server->reset();
      return Fail(std::string(joined.message()));
    }
  }
  // Cluster mode: this node's candidate for the cluster's one repairer (client/cluster_repair.h).
  // And its sweeper of copies no record names (service/orphan_sweep.h).
  std::shared_ptr<gradsnap::client::RepairWorker> repair;
  std::unique_ptr<gradsnap::service::OrphanSweeper> sweeper;
  if (membership != nullptr) {
    const std::string& node_id = o.service.node_id;
    sweeper = gradsnap::service::OrphanSweeper::Start(
        etcd.get(), (*server)->engine(), node_id, absl::ToInt64Milliseconds(cluster.orphan_grace));
    gradsnap::client::RepairOptions ro;
    ro.node_id = node_id;
    ro.lease = [m = membership.get()] { return m->WritesAllowed().ok() ? m->lease_id() : 0; };
    ro.repair_after_ms = absl::ToInt64Milliseconds(cluster.repair_after);
    ro.bandwidth_bytes_per_s = absl::GetFlag(FLAGS_repair_bandwidth_mib_s) << 20;
    ro.parallel = cluster.repair_parallel;
    ro.node_options.tls = cluster.peer_tls;  // the node's credentials towards its peers
    ro.auth_secret = o.auth_secret;
    ro.self_address = cluster.advertise;
    repair = gradsnap::client::RepairWorker::Start(etcd.get(), std::move(ro));
    absl::MutexLock lock(&puller_mu);
    puller = repair;
  }
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
  {
    absl::MutexLock lock(&puller_mu);
    puller.reset();
  }
  repair.reset();   // the leader key is handed over at once (after a copy under way ends)
  sweeper.reset();  // before the engine closes
  (*server)->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server->reset();
  member.store(nullptr);
  membership.reset();  // leaves the cluster: the lease is revoked, the node record gone
  GS_LOG(INFO) << "stopped";
  return 0;
}
