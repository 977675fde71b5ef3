#pragma once
// Certificates for the store's TLS, for sites that want their own PKI on top of the
// job's token (docs/store_security.md, "Certificates"). Empty by default: the
// token's pre-shared key is then the only credential.
//
// Note [Certificates and the token]: TLS 1.3 authenticates a handshake either by a
// pre-shared key or by certificates, never both. With certificates, the handshake
// is certificate-based mutual TLS (ephemeral ECDHE, so forward secrecy holds) and
// each end checks the other's chain against the site's CA. The token is then proved
// inside that channel: the client's first request carries a value exported from
// this connection's TLS secrets (RFC 8446, section 7.5) under the token's key, and
// the server answers with its own under another label. An exported value is
// unique to its connection, so it cannot be replayed elsewhere, and the server
// checks the client's before it shows its own. So a certificate of the site's CA
// alone does not admit a peer to a job: two jobs of one site stay apart, as they
// do without certificates.
#include <map>
#include <string>

namespace cohort::store {

struct Certificates {
  std::string ca_file;    // PEM: the CA (or CAs) the peer's chain must lead to
  std::string cert_file;  // PEM: this end's certificate, then any intermediates
  std::string key_file;   // PEM: this end's private key, unencrypted

  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// The environment's variables that name the three files.
inline constexpr char kCaVariable[] = "COHORT_STORE_TLS_CA";
inline constexpr char kCertVariable[] = "COHORT_STORE_TLS_CERT";
inline constexpr char kKeyVariable[] = "COHORT_STORE_TLS_KEY";

// Reads COHORT_STORE_TLS_CA, _CERT and _KEY: none set is no certificates. Throws
// ConfigError naming what is missing when only some are set; relative paths are
// made absolute against the current directory.
Certificates certificates_from(const std::map<std::string, std::string>& env);

}  // namespace cohort::store
