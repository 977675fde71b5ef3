#include "cohort/store/tls.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/objects.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "cohort/errors.h"

namespace cohort::store::tls {
namespace {

// TLS_AES_256_GCM_SHA384, the one suite both ends allow; the key's hash is its hash.
constexpr unsigned char kSuite[] = {0x13, 0x02};
constexpr char kKeyLabel[] = "cohort store: TLS 1.3 external PSK, v2";

std::string openssl_error(const char* what) {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fmt::format("{}: unknown error", what);
  // A system error (a file that is not there) has no reason string of its own.
  const char* reason = ERR_reason_error_string(e);
  if (reason != nullptr) return fmt::format("{}: {}", what, reason);
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return fmt::format("{}: {}", what, text);
}

// An encrypted key would make OpenSSL prompt on the terminal, in every worker.
int no_passphrase(char*, int, int, void*) { return 0; }

// Note [A socket BIO without SIGPIPE]: OpenSSL's own socket BIO writes with
// write(), which raises SIGPIPE when the peer has gone, and the store runs inside
// agents and in user programs that keep SIGPIPE's default (death). This BIO does
// the same over send(MSG_NOSIGNAL) and recv(), and marks EAGAIN as "retry", which
// OpenSSL turns into SSL_ERROR_WANT_READ / WANT_WRITE.
int bio_fd(BIO* bio) { return static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(bio))); }

bool retryable(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

int bio_write(BIO* bio, const char* data, int n) {
  BIO_clear_retry_flags(bio);
  ssize_t sent = ::send(bio_fd(bio), data, static_cast<std::size_t>(n), MSG_NOSIGNAL);
  if (sent < 0 && retryable(errno)) BIO_set_retry_write(bio);
  return static_cast<int>(sent);
}

int bio_read(BIO* bio, char* data, int n) {
  BIO_clear_retry_flags(bio);
  ssize_t got = ::recv(bio_fd(bio), data, static_cast<std::size_t>(n), 0);
  if (got < 0 && retryable(errno)) BIO_set_retry_read(bio);
  return static_cast<int>(got);
}

long bio_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int bio_create(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

BIO_METHOD* socket_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "cohort store socket");
    if (m == nullptr || BIO_meth_set_write(m, bio_write) != 1 || BIO_meth_set_read(m, bio_read) != 1 ||
        BIO_meth_set_ctrl(m, bio_ctrl) != 1 || BIO_meth_set_create(m, bio_create) != 1)
      throw CommError(openssl_error("cohort: could not set up the store's TLS socket"));
    return m;
  }();
  return method;
}

const Context& context_of(SSL* ssl) {
  return *static_cast<const Context*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), 0));
}

SSL_SESSION* psk_session(SSL* ssl, const Bytes& key) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  if (cipher == nullptr) return nullptr;
  SSL_SESSION* session = SSL_SESSION_new();
  if (session == nullptr || SSL_SESSION_set1_master_key(session, key.data(), key.size()) != 1 ||
      SSL_SESSION_set_cipher(session, cipher) != 1 || SSL_SESSION_set_protocol_version(session, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(session);
    return nullptr;
  }
  return session;
}

// Note [Certificates and the token]: the labels of the two exported proofs.
constexpr char kClientProofLabel[] = "EXPORTER-cohort-store/2 client proves the token";
constexpr char kServerProofLabel[] = "EXPORTER-cohort-store/2 server proves the token";

// Loads one of the site's PEM files, or throws naming it and its variable.
void load(bool ok, const std::string& file, const char* variable, const char* what) {
  if (ok) return;
  throw ConfigError(fmt::format("{}\n  fix: {} must name a readable PEM file holding {}",
                                openssl_error(fmt::format("cohort: the store's {} ({}={}) did not load", what,
                                                          variable, file)
                                                  .c_str()),
                                variable, what));
}

void use_certificates(SSL_CTX* ctx, const Certificates& c, Role role) {
  ERR_clear_error();
  SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
  load(SSL_CTX_load_verify_locations(ctx, c.ca_file.c_str(), nullptr) == 1, c.ca_file, kCaVariable, "CA certificate");
  load(SSL_CTX_use_certificate_chain_file(ctx, c.cert_file.c_str()) == 1, c.cert_file, kCertVariable, "certificate");
  const bool key_loaded = SSL_CTX_use_PrivateKey_file(ctx, c.key_file.c_str(), SSL_FILETYPE_PEM) == 1;
  const bool mismatch = !key_loaded && ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH;
  if (!mismatch)
    load(key_loaded, c.key_file, kKeyVariable, "private key, unencrypted (a key under a passphrase is not supported)");
  if (mismatch || SSL_CTX_check_private_key(ctx) != 1)
    throw ConfigError(fmt::format("cohort: the store's private key ({}={}) is not the key of its certificate ({}={})\n"
                                  "  fix: give each host the key that belongs to its certificate",
                                  kKeyVariable, c.key_file, kCertVariable, c.cert_file));
  // Each end requires the other's certificate, and checks its chain against the CA.
  SSL_CTX_set_verify(ctx, role == Role::kServer ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER,
                     nullptr);
}

}  // namespace

// OpenSSL's callbacks, a friend of Session so that the server can say what identity
// a refused client offered.
struct Callbacks {
  // Client: offer the token's key under our identity.
  static int use(SSL* ssl, const EVP_MD* md, const unsigned char** id, std::size_t* id_size, SSL_SESSION** out) {
    *out = nullptr;
    SSL_SESSION* session = psk_session(ssl, context_of(ssl).key());
    if (session == nullptr) return 0;
    // After a HelloRetryRequest OpenSSL asks again with the hash it settled on.
    if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(session))) {
      SSL_SESSION_free(session);
      return 1;
    }
    *out = session;
    *id = reinterpret_cast<const unsigned char*>(kPskIdentity);
    *id_size = sizeof kPskIdentity - 1;
    return 1;
  }

  // Server: the key for our identity; for any other, none (the handshake then fails:
  // this server has no certificate to fall back on).
  static int find(SSL* ssl, const unsigned char* id, std::size_t id_size, SSL_SESSION** out) {
    *out = nullptr;
    auto* self = static_cast<Session*>(SSL_get_ex_data(ssl, 0));
    if (self != nullptr) self->offered_identity_.assign(reinterpret_cast<const char*>(id), id_size);
    if (id_size != sizeof kPskIdentity - 1 || std::memcmp(id, kPskIdentity, id_size) != 0) return 1;
    *out = psk_session(ssl, context_of(ssl).key());
    return *out != nullptr ? 1 : 0;
  }
};

Context::Context(Role role, const std::string& token, const Certificates& certificates)
    : role_(role), with_certificates_(certificates.enabled()) {
  if (token.empty())
    throw ConfigError("cohort: the store token is empty\n  fix: pass the job's --rdzv-token / COHORT_RDZV_TOKEN");
  // The TLS key is a MAC of a fixed label under the token, so that the token itself
  // is used for nothing else.
  key_.resize(48);
  unsigned size = 0;
  if (HMAC(EVP_sha384(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(kKeyLabel), sizeof kKeyLabel - 1, key_.data(), &size) == nullptr)
    throw CommError(openssl_error("cohort: could not derive the store's key"));
  key_.resize(size);
  ctx_ = SSL_CTX_new(role == Role::kClient ? TLS_client_method() : TLS_server_method());
  if (ctx_ == nullptr) throw CommError(openssl_error("cohort: could not set up TLS for the store"));
  // Note [Store protocol]: TLS 1.3 only, one suite, and no SSL_OP_ALLOW_NO_DHE_KEX,
  // so the key is only ever used in psk_dhe_ke mode (forward secrecy).
  const bool ok = SSL_CTX_set_min_proto_version(ctx_, TLS1_3_VERSION) == 1 &&
                  SSL_CTX_set_max_proto_version(ctx_, TLS1_3_VERSION) == 1 &&
                  SSL_CTX_set_ciphersuites(ctx_, "TLS_AES_256_GCM_SHA384") == 1 &&
                  SSL_CTX_set_ex_data(ctx_, 0, this) == 1;
  if (!ok) {
    SSL_CTX_free(ctx_);
    throw CommError(openssl_error("cohort: could not set up TLS 1.3 for the store"));
  }
  SSL_CTX_clear_options(ctx_, SSL_OP_ALLOW_NO_DHE_KEX);
  SSL_CTX_set_mode(ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Note [Buffered TLS plaintext]: one recv() takes what the socket holds (a record's
  // header and body together, or several records), not a header, then a body.
  SSL_CTX_set_read_ahead(ctx_, 1);
  if (role == Role::kServer) SSL_CTX_set_num_tickets(ctx_, 0);  // nothing to resume: every connection proves afresh
  if (with_certificates_) {
    // Note [Certificates and the token]: no PSK on either end, so the handshake is
    // authenticated by the certificates; the token is proved after it.
    try {
      use_certificates(ctx_, certificates, role);
    } catch (...) {
      SSL_CTX_free(ctx_);
      throw;
    }
  } else if (role == Role::kClient) {
    SSL_CTX_set_psk_use_session_callback(ctx_, &Callbacks::use);
    // No trusted certificates: a server that tries to authenticate with one instead
    // of the key fails verification.
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_psk_find_session_callback(ctx_, &Callbacks::find);
  }
}

Context::~Context() { SSL_CTX_free(ctx_); }

Session::Session(const Context& context, int fd) : context_(context), fd_(fd) {
  ssl_ = SSL_new(context.native());
  BIO* bio = ssl_ ? BIO_new(socket_method()) : nullptr;
  if (bio == nullptr) {
    SSL_free(ssl_);
    throw CommError(openssl_error("cohort: could not start a TLS session for the store"));
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)));
  SSL_set_bio(ssl_, bio, bio);
  SSL_set_ex_data(ssl_, 0, this);
  if (context.role() == Role::kClient)
    SSL_set_connect_state(ssl_);
  else
    SSL_set_accept_state(ssl_);
}

Session::~Session() { SSL_free(ssl_); }

Step Session::result(int rc) {
  const int err = errno;
  switch (SSL_get_error(ssl_, rc)) {
    case SSL_ERROR_WANT_READ: return Step::kWantRead;
    case SSL_ERROR_WANT_WRITE: return Step::kWantWrite;
    case SSL_ERROR_ZERO_RETURN: return Step::kClosed;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        if (rc == 0 || err == 0 || err == ECONNRESET || err == EPIPE) return Step::kClosed;  // gone, no alert
        error_ = std::strerror(err);
        return Step::kFailed;
      }
      [[fallthrough]];
    default:
      while (unsigned long e = ERR_get_error()) {
        const int reason = ERR_GET_REASON(e);
        // Note [Telling a wrong token]: the server fails the client's binder; the
        // alert it sends for that is decrypt_error or, in OpenSSL 3.0, illegal_parameter.
        // With certificates no key is offered, so these alerts mean something else.
        if (!context_.with_certificates() &&
            (reason == SSL_R_BINDER_DOES_NOT_VERIFY || reason == SSL_R_TLSV1_ALERT_DECRYPT_ERROR ||
             reason == SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER))
          wrong_key_ = true;
        if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) certificate_failed_ = true;
        const char* text = ERR_reason_error_string(e);
        if (!error_.empty()) continue;
        // A system error (OpenSSL 3) carries errno: a reset connection reads
        // "Connection reset by peer", not a bare code.
        if (ERR_SYSTEM_ERROR(e)) error_ = std::strerror(ERR_GET_REASON(e));
        else error_ = text ? text : fmt::format("OpenSSL error {:#x}", e);
        // Say why a chain failed: "unable to get local issuer certificate", ...
        if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED)
          error_ += fmt::format(" ({})", X509_verify_cert_error_string(SSL_get_verify_result(ssl_)));
      }
      if (error_.empty()) error_ = "TLS failed";
      return Step::kFailed;
  }
}

Step Session::step_handshake() {
  ERR_clear_error();
  errno = 0;
  int rc = SSL_do_handshake(ssl_);
  return rc == 1 ? Step::kDone : result(rc);
}

Step Session::read_some(std::uint8_t* data, std::size_t n, std::size_t& got) {
  got = 0;
  if (n == 0) return Step::kDone;
  ERR_clear_error();
  errno = 0;
  int rc = SSL_read(ssl_, data, static_cast<int>(std::min<std::size_t>(n, 1 << 30)));
  if (rc > 0) {
    got = static_cast<std::size_t>(rc);
    drained_ = false;
    return Step::kDone;
  }
  const Step step = result(rc);
  // What OpenSSL holds now, if anything, is part of a record that only the socket
  // can complete (Note [Buffered TLS plaintext]).
  drained_ = step == Step::kWantRead;
  return step;
}

Step Session::write_some(const std::uint8_t* data, std::size_t n, std::size_t& written) {
  written = 0;
  if (n == 0) return Step::kDone;
  ERR_clear_error();
  errno = 0;
  int rc = SSL_write(ssl_, data, static_cast<int>(std::min<std::size_t>(n, 1 << 30)));
  if (rc > 0) {
    written = static_cast<std::size_t>(rc);
    return Step::kDone;
  }
  return result(rc);
}

bool Session::has_buffered() const { return !drained_ && SSL_has_pending(ssl_) == 1; }

void Session::shutdown() {
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

net::Io Session::wait(Step step, net::Clock::time_point deadline) const {
  switch (step) {
    case Step::kWantRead: return net::wait_for(fd_, POLLIN, deadline) ? net::Io::kDone : net::Io::kTimedOut;
    case Step::kWantWrite: return net::wait_for(fd_, POLLOUT, deadline) ? net::Io::kDone : net::Io::kTimedOut;
    case Step::kClosed: return net::Io::kClosed;
    case Step::kFailed: return net::Io::kFailed;
    case Step::kDone: break;
  }
  return net::Io::kDone;
}

net::Io Session::handshake(net::Clock::time_point deadline) {
  for (;;) {
    Step step = step_handshake();
    if (step == Step::kDone) return net::Io::kDone;
    if (auto io = wait(step, deadline); io != net::Io::kDone) return io;
  }
}

net::Io Session::write_all(const std::uint8_t* data, std::size_t n, net::Clock::time_point deadline) {
  while (n > 0) {
    std::size_t written = 0;
    Step step = write_some(data, n, written);
    data += written;
    n -= written;
    if (step != Step::kDone)
      if (auto io = wait(step, deadline); io != net::Io::kDone) return io;
  }
  return net::Io::kDone;
}

net::Io Session::read_exact(std::uint8_t* data, std::size_t n, net::Clock::time_point deadline) {
  while (n > 0) {
    std::size_t got = 0;
    Step step = read_some(data, n, got);
    data += got;
    n -= got;
    if (step != Step::kDone)
      if (auto io = wait(step, deadline); io != net::Io::kDone) return io;
  }
  return net::Io::kDone;
}

bool Session::used_the_key() const { return SSL_session_reused(ssl_) == 1; }

// OpenSSL keeps the peer's certificate only once it has verified.
bool Session::peer_has_certificate() const {
  return certificate_failed_ || SSL_get0_peer_certificate(ssl_) != nullptr;
}

bool Session::peer_verified() const {
  return context_.with_certificates() && peer_has_certificate() && SSL_get_verify_result(ssl_) == X509_V_OK;
}

Bytes Session::token_proof(Role of) const {
  const char* label = of == Role::kClient ? kClientProofLabel : kServerProofLabel;
  Bytes proof(48);
  const Bytes& key = context_.key();
  if (SSL_export_keying_material(ssl_, proof.data(), proof.size(), label, std::strlen(label), key.data(), key.size(),
                                 1) != 1)
    throw CommError(openssl_error("cohort: could not export the store's proof of the token"));
  return proof;
}

std::string Session::key_exchange_group() const {
  const int nid = SSL_get_negotiated_group(ssl_);
  if (nid <= 0) return {};
  const char* name = OBJ_nid2sn(nid);
  return name ? name : fmt::format("group {:#x}", nid);
}

}  // namespace cohort::store::tls
