// The shared etcd security flags (etcd_flags.h).
#include "cluster/etcd_flags.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, etcd_ca, "",
          "With https:// --etcd endpoints: PEM CA etcd's certificates chain to. Default: empty "
          "(the system's roots)");
ABSL_FLAG(std::string, etcd_cert, "",
          "With https:// --etcd endpoints: PEM client certificate for etcd's --client-cert-auth "
          "(with --etcd-key). Default: none");
ABSL_FLAG(std::string, etcd_key, "", "PEM private key of --etcd-cert. Default: none");
ABSL_FLAG(std::string, etcd_user, "",
          "With --etcd: etcd user (etcd's auth enabled); its password from --etcd-password-file "
          "or $GRADSNAP_ETCD_PASSWORD, never a flag. Default: none");
ABSL_FLAG(std::string, etcd_password_file, "",
          "File whose first line is the password of --etcd-user. Default: none "
          "($GRADSNAP_ETCD_PASSWORD)");

namespace gradsnap {
namespace cluster {

absl::StatusOr<EtcdOptions> EtcdOptionsFromCommandLine(const std::string& etcd) {
  const TlsFiles tls = {.cert_file = absl::GetFlag(FLAGS_etcd_cert),
                        .key_file = absl::GetFlag(FLAGS_etcd_key),
                        .ca_file = absl::GetFlag(FLAGS_etcd_ca)};
  const std::string user = absl::GetFlag(FLAGS_etcd_user);
  const std::string password_file = absl::GetFlag(FLAGS_etcd_password_file);
  if (etcd.empty()) {
    const std::pair<const char*, std::string> set[] = {
        {"--etcd-ca", tls.ca_file}, {"--etcd-cert", tls.cert_file},
        {"--etcd-key", tls.key_file}, {"--etcd-user", user},
        {"--etcd-password-file", password_file}};
    for (const auto& [flag, value] : set) {
      if (!value.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " needs --etcd"));
    }
    return EtcdOptions{};
  }
  return EtcdOptionsFromFlags(etcd, tls, user, password_file);
}

}  // namespace cluster
}  // namespace gradsnap
