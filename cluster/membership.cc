// Membership (membership.h).
#include "cluster/membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/key_value_text.h"
#include "common/logging.h"
#include "common/stats.h"
#include "common/status.h"

namespace gradsnap {
namespace cluster {

namespace {

constexpr char kNodeRecordVersion[] = "gradsnap-node 1";

struct MembershipMetrics {
  Counter* losses;
  Counter* live;
  static MembershipMetrics* Get() {
    static MembershipMetrics* m = [] {
      Registry* r = Registry::Global();
      return new MembershipMetrics{
          r->GetCounter("gradsnap_cluster_lease_losses_total",
                        "Times this node lost its etcd lease (writes refused until renewed)"),
          r->GetCounter("gradsnap_cluster_lease_live",
                        "1 while this node holds a live etcd lease (takes writes)", true)};
    }();
    return m;
  }
};

}  // namespace

std::string EncodeNodeRecord(const NodeRecord& r) {
  return absl::StrCat(kNodeRecordVersion, "\naddress=", r.address,
                      "\ncapacity_bytes=", r.capacity_bytes, "\nfree_bytes=", r.free_bytes, "\n");
}

absl::StatusOr<NodeRecord> DecodeNodeRecord(const EtcdKv& kv) {
  NodeRecord r;
  r.id = kv.key.substr(std::min(kv.key.size(), sizeof(kNodesPrefix) - 1));
  r.lease = kv.lease;
  auto fields = ParseKeyValueText(kv.value, kNodeRecordVersion);
  if (!fields.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("node record ", kv.key, ": ",
                                                   fields.status().message()));
  }
  r.address = (*fields)["address"];
  if (r.address.empty() ||
      !absl::SimpleAtoi((*fields)["capacity_bytes"], &r.capacity_bytes) ||
      !absl::SimpleAtoi((*fields)["free_bytes"], &r.free_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("node record ", kv.key, " is malformed"));
  }
  return r;
}

Membership::Membership(EtcdClient* etcd, const MembershipOptions& options)
    : etcd_(etcd), options_(options) {
  MembershipMetrics::Get();  // listed from the start, at 0
}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Join(EtcdClient* etcd,
                                                             const MembershipOptions& options) {
  if (options.node_id.empty() || options.address.empty() || options.ttl_s < 1) {
    return absl::InvalidArgumentError("membership: node id, address and a TTL >= 1 s needed");
  }
  std::unique_ptr<Membership> m(new Membership(etcd, options));
  RETURN_IF_ERROR(m->Register());
  m->thread_ = std::thread([p = m.get()] { p->KeepAliveLoop(); });
  return m;
}

Membership::~Membership() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  int64_t lease = lease_id();
  if (lease != 0) etcd_->RevokeLease(lease).IgnoreError();  // else it expires after its TTL
}

absl::Status Membership::Register() {
  const Clock::time_point sent = Clock::now();
  ASSIGN_OR_RETURN(EtcdClient::Lease lease, etcd_->GrantLease(options_.ttl_s));
  NodeRecord r;
  r.address = options_.address;
  if (options_.space) options_.space(&r.capacity_bytes, &r.free_bytes);
  absl::Status put = etcd_->Put(absl::StrCat(kNodesPrefix, options_.node_id),
                                EncodeNodeRecord(r), lease.id).status();
  if (!put.ok()) {
    etcd_->RevokeLease(lease.id).IgnoreError();
    return put;
  }
  put_free_ = r.free_bytes;
  MembershipMetrics::Get()->live->Set(1);
  absl::MutexLock lock(&mu_);
  lease_ = lease.id;
  ttl_s_ = lease.ttl_s;
  valid_until_ = sent + std::chrono::seconds(lease.ttl_s);
  if (!live_) {
    GS_LOG(INFO) << "cluster: node " << options_.node_id << " registered as "
                 << options_.address << " under lease " << lease.id << " (TTL " << lease.ttl_s
                 << " s): writes accepted";
  }
  live_ = true;
  return absl::OkStatus();
}

void Membership::LoseLease(const std::string& why) {
  if (live_) {
    ++losses_;
    MembershipMetrics::Get()->losses->Add();
    MembershipMetrics::Get()->live->Set(0);
    GS_LOG(WARNING) << "cluster: node " << options_.node_id << " lost its lease (" << why
                    << "): writes refused until it holds one again";
  }
  live_ = false;
}

void Membership::KeepAliveLoop() {
  bool failed = false;  // the last keep-alive failed: the next one comes sooner
  for (;;) {
    int64_t lease = 0;
    std::chrono::milliseconds interval;
    int member_timeout_ms = 0;
    {
      absl::MutexLock lock(&mu_);
      // A third of the TTL: two renewals may fail before the lease runs out. After a failure,
      // a twelfth. Each member gets a sixth of the TTL to answer (at least 250 ms): a member
      // that waits for a new leader after the old one was killed is left for the next one,
      // and the keep-alive is tried again, well before the lease runs out (docs/protocol.md).
      const int64_t ttl_ms = ttl_s_ * 1000;
      interval = std::chrono::milliseconds(
          failed ? std::max<int64_t>(100, ttl_ms / 12) : std::max<int64_t>(300, ttl_ms / 3));
      member_timeout_ms = static_cast<int>(std::max<int64_t>(250, ttl_ms / 6));
      auto stop = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop),
                               absl::Milliseconds(interval.count()))) {
        return;
      }
      if (live_ && Clock::now() >= valid_until_) LoseLease("not renewed within its TTL");
      lease = lease_;
    }
    if (lease == 0) {
      absl::Status s = Register();
      if (!s.ok()) GS_LOG(DEBUG) << "cluster: registering again: " << s;
      continue;
    }
    const Clock::time_point sent = Clock::now();
    absl::StatusOr<int64_t> ttl = etcd_->KeepAliveOnce(lease, member_timeout_ms);
    failed = !ttl.ok();
    if (!ttl.ok()) {
      GS_LOG(DEBUG) << "cluster: lease keep-alive: " << ttl.status();
      continue;  // valid_until_ runs out by itself
    }
    {
      absl::MutexLock lock(&mu_);
      if (*ttl <= 0) {  // etcd let it expire (or it was revoked): its record is gone
        LoseLease("expired in etcd");
        lease_ = 0;
        continue;
      }
      const Clock::time_point until = sent + std::chrono::seconds(*ttl);
      if (Clock::now() < until) {
        if (!live_) {
          GS_LOG(INFO) << "cluster: node " << options_.node_id << " renewed lease " << lease
                       << ": writes accepted again";
          MembershipMetrics::Get()->live->Set(1);
        }
        valid_until_ = std::max(valid_until_, until);
        live_ = true;
      }
    }
    RefreshSpace(lease);
  }
}

void Membership::RefreshSpace(int64_t lease) {
  if (!options_.space) return;
  NodeRecord r;
  r.address = options_.address;
  options_.space(&r.capacity_bytes, &r.free_bytes);
  const uint64_t moved = r.free_bytes > put_free_ ? r.free_bytes - put_free_
                                                  : put_free_ - r.free_bytes;
  const double threshold = std::max(
      1048576.0, kSpaceRefreshFraction * static_cast<double>(r.capacity_bytes));
  if (static_cast<double>(moved) < threshold) return;
  absl::Status put =
      etcd_->Put(absl::StrCat(kNodesPrefix, options_.node_id), EncodeNodeRecord(r), lease)
          .status();
  if (put.ok()) {
    put_free_ = r.free_bytes;
  } else {  // the lease may have gone meanwhile: the next registration puts the record anew
    GS_LOG(DEBUG) << "cluster: refreshing the node record's free bytes: " << put;
  }
}

absl::Status Membership::WritesAllowed() const {
  absl::MutexLock lock(&mu_);
  if (lease_ != 0 && Clock::now() < valid_until_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "node ", options_.node_id, " ", kNoLiveLease, " (etcd ", etcd_->endpoints_text(),
      " not reached in time): writes refused until it is renewed"));
}

int64_t Membership::lease_id() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

int64_t Membership::granted_ttl_s() const {
  absl::MutexLock lock(&mu_);
  return ttl_s_;
}

uint64_t Membership::lease_losses() const {
  absl::MutexLock lock(&mu_);
  return losses_;
}

}  // namespace cluster
}  // namespace gradsnap
