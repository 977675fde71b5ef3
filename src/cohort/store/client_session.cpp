#include "cohort/store/client_session.h"

#include <algorithm>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cohort/errors.h"
#include "cohort/store/handshake.h"

namespace cohort::store {
namespace {

using net::Clock;

// The handshake over a connected socket. nullopt when the server dropped the
// connection or went quiet, which is worth another try: it had too many peers
// mid-handshake, or was stopping. Throws when it answered but must not be used.
std::optional<ClientSession> handshake_over(net::Fd fd, const std::string& where, const std::string& token,
                                            Clock::time_point deadline, std::string& last_error) {
  auto again = [&](net::Io io) -> std::optional<ClientSession> {
    last_error = io == net::Io::kTimedOut ? "the handshake did not complete"
                                          : "the server closed the connection during the handshake";
    return std::nullopt;
  };
  Bytes hello(handshake::kServerHelloSize);
  if (auto io = net::read_exact(fd.get(), hello.data(), hello.size(), deadline); io != net::Io::kDone)
    return again(io);
  auto server_nonce = handshake::parse_server_hello(hello);
  if (server_nonce.empty())
    throw CommError(fmt::format("cohort: {} does not speak cohort's store protocol (a TCPStore, or another version "
                                "of cohort?)\n  fix: check the rendezvous address and port",
                                where));
  auto client_nonce = handshake::random_nonce();
  auto mine = handshake::client_hello(token, server_nonce, client_nonce);
  std::uint8_t verdict = 0;
  auto io = net::write_all(fd.get(), mine.data(), mine.size(), deadline);
  if (io == net::Io::kDone) io = net::read_exact(fd.get(), &verdict, 1, deadline);
  if (io != net::Io::kDone) return again(io);
  if (verdict == static_cast<std::uint8_t>(handshake::Verdict::kWrongToken))
    throw ConfigError(fmt::format("cohort: the store at {} holds a different token: pass the job's --rdzv-token / "
                                  "COHORT_RDZV_TOKEN",
                                  where));
  if (verdict != static_cast<std::uint8_t>(handshake::Verdict::kAccepted))
    throw CommError(fmt::format("cohort: the store at {} speaks another version of the store protocol\n  fix: run "
                                "the same cohort on every host of the job",
                                where));
  Bytes proof(handshake::kProofSize);
  if (io = net::read_exact(fd.get(), proof.data(), proof.size(), deadline); io != net::Io::kDone) return again(io);
  if (!handshake::check_server_proof(token, server_nonce, client_nonce, proof))
    throw CommError(fmt::format("cohort: the store at {} failed to prove that it holds the token; something else "
                                "answers at that address\n  fix: check the rendezvous address and port",
                                where));
  auto keys = handshake::session_keys(token, server_nonce, client_nonce);
  return ClientSession{std::move(fd), std::make_unique<FrameSealer>(keys.client_to_server),
                       std::make_unique<FrameOpener>(keys.server_to_client)};
}

}  // namespace

ClientSession open_session(const std::string& host, int port, const std::string& token,
                           std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto where = fmt::format("{}:{}", host, port);
  std::string last_error;
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    if (auto fd = net::connect_once(host, port, deadline, last_error))
      if (auto session = handshake_over(std::move(fd), where, token, deadline, last_error)) return std::move(*session);
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
