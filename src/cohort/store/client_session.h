#pragma once
// Opening an authenticated connection to a store server: connecting (retrying
// while nobody listens yet) and the client's half of the TLS handshake in Note
// [Store protocol] (store/wire.h).
#include <chrono>
#include <memory>
#include <string>

#include "cohort/store/certificates.h"
#include "cohort/store/net.h"
#include "cohort/store/tls.h"

namespace cohort::store {

struct ClientSession {
  std::unique_ptr<tls::Context> context;
  net::Fd fd;
  std::unique_ptr<tls::Session> tls;  // over fd, under context
};

// Throws TimeoutError when no store answers at host:port within `timeout`,
// ConfigError when it holds another token, CommError when it speaks another
// protocol or fails to prove that it holds the token.
// With `certificates`, the handshake is mutual TLS under them and the token is
// proved inside it (Note [Certificates and the token] in store/certificates.h).
ClientSession open_session(const std::string& host, int port, const std::string& token,
                           std::chrono::milliseconds timeout, const Certificates& certificates = {});

}  // namespace cohort::store
