#pragma once
// TLS 1.3 for the store's connections, keyed by the job's token: OpenSSL with an
// external pre-shared key and no certificates, or, where a site gives them,
// certificate-based mutual TLS with the token proved inside the channel. See Note
// [Store protocol] in store/wire.h for what it proves and why it gives forward
// secrecy, and Note [Certificates and the token] in store/certificates.h.
//
// A Context is one end's configuration (client or server) and owns the key; a
// Session is one connection over a non-blocking socket. The server drives its
// sessions from its event loop (step_handshake, read_some, write_some); a client
// uses the blocking helpers, each bounded by a deadline.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/store/certificates.h"
#include "cohort/store/net.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace cohort::store::tls {

using Bytes = std::vector<std::uint8_t>;

// Names the key and the protocol's version: a peer of another version offers
// another identity, and the server reports it as such.
inline constexpr char kPskIdentity[] = "cohort-store/2";

// A TLS record starts with this content type (handshake); a peer whose first byte
// is anything else does not speak TLS.
inline constexpr std::uint8_t kHandshakeRecord = 0x16;

enum class Role { kClient, kServer };

class Context {
 public:
  // Throws ConfigError for an empty token or certificate files that do not load
  // (naming the file and its variable), CommError when OpenSSL fails.
  Context(Role role, const std::string& token, const Certificates& certificates = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Role role() const { return role_; }
  const Bytes& key() const { return key_; }
  // Certificate-based mutual TLS (Note [Certificates and the token]).
  bool with_certificates() const { return with_certificates_; }
  // For tests that inspect the handshake (OpenSSL's keylog callback, for one).
  SSL_CTX* native() const { return ctx_; }

 private:
  Role role_;
  Bytes key_;  // derived from the token; never the token itself
  bool with_certificates_ = false;
  SSL_CTX* ctx_ = nullptr;
};

// What a non-blocking step needs next, or how it ended.
enum class Step { kDone, kWantRead, kWantWrite, kClosed, kFailed };

class Session {
 public:
  // Takes no ownership of `fd`; `context` must outlive the session.
  Session(const Context& context, int fd);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // One non-blocking step of the handshake.
  Step step_handshake();
  // Reads what is there now, at most `n` bytes, into `data`; kDone when `got` > 0,
  // kWantRead when nothing is ready.
  Step read_some(std::uint8_t* data, std::size_t n, std::size_t& got);
  // Sends from the front of `data`; `written` says how much was taken.
  Step write_some(const std::uint8_t* data, std::size_t n, std::size_t& written);
  // Bytes OpenSSL took from the socket and read_some may hand out without the
  // socket: decrypted plaintext, or whole records read ahead. epoll cannot see
  // them (Note [Buffered TLS plaintext] in store/server_loop.h). False once a read
  // has wanted the socket, until the next read that gets something.
  bool has_buffered() const;
  // A close_notify, best effort, without waiting for the peer's.
  void shutdown();

  // Blocking helpers for a client: each returns kDone, or says why not by
  // `deadline` (kTimedOut), or that the peer closed or failed (error() says how).
  net::Io handshake(net::Clock::time_point deadline);
  net::Io write_all(const std::uint8_t* data, std::size_t n, net::Clock::time_point deadline);
  net::Io read_exact(std::uint8_t* data, std::size_t n, net::Clock::time_point deadline);

  // After kFailed: OpenSSL's reason, e.g. "tlsv1 alert decrypt error".
  const std::string& error() const { return error_; }
  // The peer presented our token: its binder verified (server), or the server's
  // Finished did under our key (client). Only meaningful once the handshake is done.
  bool used_the_key() const;
  // Note [Telling a wrong token]: whether the handshake failed because the peer
  // holds a different key. On the server the client's PSK binder failed to verify;
  // the client learns it from the alert the server sends for that. Between two
  // cohorts of one protocol version (one PSK identity) nothing else sends that
  // alert, so it reads as "a different token".
  bool wrong_key() const { return wrong_key_; }
  // The ephemeral key exchange's group (e.g. "X25519"), empty when there was none.
  std::string key_exchange_group() const;
  // On the server: the PSK identity the client offered, empty when it offered none.
  const std::string& offered_identity() const { return offered_identity_; }
  // The peer showed a certificate, whether or not it verified.
  bool peer_has_certificate() const;
  // With certificates: the peer's chain verified against our CA.
  bool peer_verified() const;
  // Note [Certificates and the token]: the proof of the token that `of` sends on
  // this connection, exported from its TLS secrets under the token's key.
  Bytes token_proof(Role of) const;

  SSL* native() const { return ssl_; }

 private:
  friend struct Callbacks;
  Step result(int rc);
  net::Io wait(Step step, net::Clock::time_point deadline) const;

  const Context& context_;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  std::string error_;
  std::string offered_identity_;
  bool wrong_key_ = false;
  bool certificate_failed_ = false;
  bool drained_ = false;  // the last read_some wanted the socket
};

}  // namespace cohort::store::tls
