// TLS files of a gRPC connection, named the same on both ends: ClientOptions::tls (the remote
// client, gradsnap's --tls-ca/--tls-cert/--tls-key) and service::ServerOptions::tls
// (gradsnap-server's --tls-client-ca/--tls-cert/--tls-key). Paths of PEM files, read once when
// the client connects or the server starts; an unset field is the empty string.
#ifndef GRADSNAP_INCLUDE_GRADSNAP_TLS_H_
#define GRADSNAP_INCLUDE_GRADSNAP_TLS_H_

#include <string>

namespace gradsnap {

struct TlsFiles {
  // This end's certificate chain. Server: its certificate; setting it (with key_file) turns
  // TLS on. Client: the client certificate for mutual TLS (needs ca_file). Default: empty.
  std::string cert_file;
  // The private key of cert_file; set together with it. Default: empty.
  std::string key_file;
  // The CA the peer's certificate must chain to. Client: the server's CA; setting it turns TLS
  // on. Server: the client CA; setting it (with cert_file) requires and verifies client
  // certificates (mutual TLS). Default: empty (client: plaintext; server: no client
  // certificates).
  std::string ca_file;
};

}  // namespace gradsnap

#endif  // GRADSNAP_INCLUDE_GRADSNAP_TLS_H_
