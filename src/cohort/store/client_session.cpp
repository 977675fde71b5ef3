#include "cohort/store/client_session.h"

#include <algorithm>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::store {
namespace {

using net::Clock;

// The handshake over a connected socket. nullopt when the server dropped the
// connection or went quiet, which is worth another try: it had too many peers
// mid-handshake, or was stopping. Throws when it answered but must not be used.
std::unique_ptr<tls::Session> handshake_over(const tls::Context& context, int fd, const std::string& where,
                                             Clock::time_point deadline, std::string& last_error) {
  auto session = std::make_unique<tls::Session>(context, fd);
  switch (session->handshake(deadline)) {
    case net::Io::kDone: break;
    case net::Io::kTimedOut: last_error = "the TLS handshake did not complete"; return nullptr;
    case net::Io::kClosed: last_error = "the server closed the connection during the handshake"; return nullptr;
    case net::Io::kFailed:
      if (session->wrong_key())
        throw ConfigError(fmt::format("cohort: the store at {} holds a different token: pass the job's "
                                      "--rdzv-token / COHORT_RDZV_TOKEN",
                                      where));
      throw CommError(fmt::format("cohort: the store at {} failed the TLS handshake ({}): it is not cohort's store, "
                                  "or runs another version of cohort\n  fix: check the rendezvous address and port, "
                                  "and run the same cohort on every host of the job",
                                  where, session->error()));
  }
  // Note [Store protocol]: only the key proves the server; a certificate never does.
  if (!session->used_the_key())
    throw CommError(fmt::format("cohort: the store at {} failed to prove that it holds the token; something else "
                                "answers at that address\n  fix: check the rendezvous address and port",
                                where));
  return session;
}

}  // namespace

ClientSession open_session(const std::string& host, int port, const std::string& token,
                           std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto where = fmt::format("{}:{}", host, port);
  auto context = std::make_unique<tls::Context>(tls::Role::kClient, token);
  std::string last_error;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    if (auto fd = net::connect_once(host, port, deadline, last_error))
      if (auto tls = handshake_over(*context, fd.get(), where, deadline, last_error))
        return ClientSession{std::move(context), std::move(fd), std::move(tls)};
    auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(fmt::format("cohort: no store answered at {} within {:.1f} s (last attempt: {})\n  fix: is "
                                     "the agent that hosts the rendezvous running? check the host and port, and "
                                     "that this host can reach them",
                                     where, std::chrono::duration<double>(timeout).count(), last_error),
                         "connect to store", {});
    // Backing off between attempts, not synchronising: the server may start any time.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace cohort::store
