#include "service/server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "proto/convert.h"
#include "proto/tls.h"
#include "proto/transport.h"

namespace gradsnap {
namespace service {
namespace {

// TLS is on when the server has a certificate; a CA then also demands client certificates.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(const TlsFiles& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty()) {
    if (!tls.ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  ASSIGN_OR_RETURN(proto::TlsPem pem, proto::ReadTlsPem(tls));
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  pair.private_key = std::move(pem.key);
  pair.cert_chain = std::move(pem.cert);
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!pem.ca.empty()) {
    ssl.pem_root_certs = std::move(pem.ca);
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  std::unique_ptr<Server> s(new Server);
  if (options.engine.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  std::string host;
  int want_port = 0;
  RETURN_IF_ERROR(SplitHostPort(options.listen, &host, &want_port));
  ASSIGN_OR_RETURN(auto creds, MakeCredentials(options.tls));
  ASSIGN_OR_RETURN(s->engine_, storage::Engine::Open(options.engine));
  s->auth_ = std::make_unique<Authorizer>(options.auth_secret, options.cluster_mode);
  if (!s->auth_->enabled()) {
    GS_LOG(WARNING) << "no --auth-secret-file: the server runs OPEN, every client may read and "
                       "write every job";
  }
  ServiceMetrics* metrics = ServiceMetrics::Get();
  metrics->SetWriteSpace(s->engine_->WriteSpace());
  s->limiter_ = std::make_unique<InflightLimiter>(options.max_inflight_bytes,
                                                  metrics->inflight_bytes);
  s->read_limiter_ = std::make_unique<InflightLimiter>(
      options.max_inflight_bytes,
      Registry::Global()->GetCounter("gradsnap_read_inflight_bytes",
                                     "Read-ahead bytes reserved by disk reads", true));
  s->cache_ = std::make_unique<ShardCache>(options.cache_bytes);
  StorageServiceOptions so = options.service;
  so.digest = options.engine.digest;
  if (so.per_stream_bytes == 0) {
    so.per_stream_bytes =
        proto::kMaxMessageBytes +
        std::min<uint64_t>(2 * (so.flush_bytes + 2 * options.engine.chunk_bytes),
                           storage::MaxShardWriterBufferBytes(options.engine));
  }
  if (so.per_stream_bytes > options.max_inflight_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("--max-inflight-bytes must be at least ",
                                                   so.per_stream_bytes, " (one upload stream)"));
  }
  s->service_ = std::make_unique<StorageService>(s->engine_.get(), s->auth_.get(),
                                                 s->limiter_.get(), s->read_limiter_.get(),
                                                 s->cache_.get(), so);
  // grpc.health.v1.Health for probes and load balancers (gRPC's implementation); a global
  // setting read by the builder below.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // One server per port: without this gRPC sets SO_REUSEPORT, and a second server on the same
  // port would silently take half of the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, creds, &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(proto::kMaxMessageBytes));
  builder.SetMaxSendMessageSize(static_cast<int>(proto::kMaxMessageBytes));
  for (const auto& [name, value] : proto::TransportArgs()) builder.AddChannelArgument(name, value);
  if (options.keepalive_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_ms);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                               std::max(1000, options.keepalive_ms / 3));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    // Pings while a call is stuck (no data moving) are the point: no cap on them.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  // gRPC's own buffers (HTTP/2 windows of streams waiting for the in-flight budget, read
  // slices) are capped too: under pressure gRPC shrinks its windows, so senders stall.
  // Idle sync-server pollers wake this often; a shorter period makes Shutdown() prompt (the
  // default, 10 s, delays a SIGTERM exit by seconds).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 200);
  grpc::ResourceQuota quota("gradsnap-server");
  quota.Resize(options.max_inflight_bytes);
  builder.SetResourceQuota(quota);
  s->grpc_ = builder.BuildAndStart();
  if (s->grpc_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen,
        " (address in use by another server, or not a local address)"));
  }
  s->address_ = absl::StrCat(host, ":", s->port_);
  if (s->grpc_->GetHealthCheckService() == nullptr) {
    return absl::InternalError("gRPC built without its health checking service");
  }
  s->RefreshHealth();  // the first answer is right before the ready line is printed
  s->health_thread_ = std::thread([server = s.get()] {
    while (!server->health_stop_.WaitForNotificationWithTimeout(
        absl::Milliseconds(kHealthRefreshMs))) {
      server->RefreshHealth();
    }
  });
  if (!options.metrics_listen.empty()) {
    s->metrics_ = std::make_unique<MetricsHttpServer>();
    storage::Engine* engine = s->engine_.get();
    RETURN_IF_ERROR(s->metrics_->Start(options.metrics_listen, [engine, metrics] {
      metrics->SetWriteSpace(engine->WriteSpace());
    }));
  }
  return s;
}

void Server::RefreshHealth() {
  const bool writes = !engine_->WriteSpace().writes_refused;
  grpc::HealthCheckServiceInterface* health = grpc_->GetHealthCheckService();
  health->SetServingStatus(kHealthReadService, true);
  health->SetServingStatus(kHealthWriteService, writes);
  health->SetServingStatus("", writes);  // last: who sees it change sees the others set
}

void Server::Shutdown(absl::Duration grace) {
  if (stopped_) return;
  stopped_ = true;
  if (health_thread_.joinable()) {
    health_stop_.Notify();
    health_thread_.join();
  }
  // NOT_SERVING for every name from now on (Watch callers hear it), before calls drain.
  if (grpc_->GetHealthCheckService() != nullptr) grpc_->GetHealthCheckService()->Shutdown();
  service_->BeginShutdown();
  grpc_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  grpc_->Wait();
  GS_LOG(INFO) << "gRPC server stopped";
  if (metrics_) metrics_->Stop();
  engine_.reset();
  GS_LOG(INFO) << "engine closed";
}

Server::~Server() {
  if (grpc_ != nullptr) Shutdown(absl::ZeroDuration());
}

}  // namespace service
}  // namespace gradsnap
