#include "proto/tls.h"

#include "absl/strings/str_cat.h"
#include "common/small_file.h"
#include "common/status.h"

namespace gradsnap {
namespace proto {
namespace {

// An unset path reads as empty; a set one must name a non-empty file (an empty PEM would only
// fail later, inside the TLS handshake, with a less clear message).
absl::Status ReadPem(const std::string& path, const char* what, std::string* out) {
  if (path.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(*out, ReadSmallFile(path, what));
  if (out->empty()) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsPem> ReadTlsPem(const TlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError("a TLS certificate and its key go together");
  }
  TlsPem pem;
  RETURN_IF_ERROR(ReadPem(files.cert_file, "TLS certificate", &pem.cert));
  RETURN_IF_ERROR(ReadPem(files.key_file, "TLS key", &pem.key));
  RETURN_IF_ERROR(ReadPem(files.ca_file, "TLS CA", &pem.ca));
  return pem;
}

}  // namespace proto
}  // namespace gradsnap
