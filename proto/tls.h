// Reading the PEM files of gradsnap/tls.h, for gradsnap-server and the remote client alike.
// Each side decides which files it needs and puts the bytes into its own gRPC credentials
// options (service/server.cc, client/remote_rpc.h).
#ifndef GRADSNAP_PROTO_TLS_H_
#define GRADSNAP_PROTO_TLS_H_

#include <string>

#include "absl/status/statusor.h"
#include "gradsnap/tls.h"

namespace gradsnap {
namespace proto {

// The contents of TlsFiles' files; a field is empty when its file is not set.
struct TlsPem {
  std::string cert;
  std::string key;
  std::string ca;
};

// Reads every file `files` sets. INVALID_ARGUMENT when only one of cert_file and key_file is
// set, or a file is empty or not a regular file; NOT_FOUND when one cannot be opened; other
// read errors as common/small_file.h. Each message names the file.
absl::StatusOr<TlsPem> ReadTlsPem(const TlsFiles& files);

}  // namespace proto
}  // namespace gradsnap

#endif  // GRADSNAP_PROTO_TLS_H_
