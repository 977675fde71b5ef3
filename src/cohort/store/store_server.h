#pragma once
// The server of cohort's authenticated key-value store: an in-memory map served to
// peers that hold the job's token (Note [Store protocol] in store/wire.h). The
// agent that hosts `cohort run`'s rendezvous owns one; the workers and the other
// agents reach it with a StoreClient (store/store_client.h).
//
//   cohort::store::StoreServer server(
//       cohort::store::StoreServerOptions(token).bind_address("0.0.0.0").port(29400));
//   // ... hand "host:" + std::to_string(server.port()) and the token to the peers.
#include <torch/arg.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "cohort/store/certificates.h"

namespace cohort::store {

// Room for a reply's own fields and a key beside the largest value.
inline constexpr std::size_t kReplyOverheadBytes = 64 * 1024;

struct StoreServerOptions {
  explicit StoreServerOptions(std::string token) : token_(std::move(token)) {}
  // The shared secret; must not be empty.
  TORCH_ARG(std::string, token);
  // An IPv4 literal; "0.0.0.0" listens on every interface.
  TORCH_ARG(std::string, bind_address) = "127.0.0.1";
  // 0 picks a free port; StoreServer::port() tells which.
  TORCH_ARG(int, port) = 0;
  // A peer that has not proved the token by then is disconnected (a peer holding
  // the token needs a round trip; Note [Pending handshakes under a flood]).
  TORCH_ARG(std::chrono::milliseconds, handshake_timeout) = std::chrono::seconds(1);
  // The most bytes the server buffers for one connection, in each direction: a
  // request, or replies not yet read. A peer that sends more while a request of its
  // own waits, or leaves more of its replies unread, gets an error naming this limit
  // and is disconnected. At least max_value_bytes + kReplyOverheadBytes, so that
  // every stored value can be read back; a connection costs the server up to about
  // twice this while one of its requests is decoded (Note [Buffers per connection]).
  TORCH_ARG(std::size_t, max_buffer_bytes) = (std::size_t{64} << 20) + kReplyOverheadBytes;
  // Called from the server's thread once per refused peer, with a one-line reason
  // that names the peer's address. It must not block for long: the store waits.
  TORCH_ARG(std::function<void(const std::string&)>, on_refused) = nullptr;
  // Caps on what peers holding the token can make the server hold: one value
  // (64 MiB), and every key and value together (1 GiB). A write over either is
  // refused with an error that names it (Note [Store memory caps] in store/table.h).
  TORCH_ARG(std::size_t, max_value_bytes) = std::size_t{64} << 20;
  TORCH_ARG(std::size_t, max_table_bytes) = std::size_t{1} << 30;
  // The site's CA, this server's certificate and key: every peer must then show a
  // certificate of that CA as well as prove the token (Note [Certificates and the
  // token] in store/certificates.h). Empty: the token alone.
  TORCH_ARG(Certificates, certificates);
};

class ServerLoop;

class StoreServer {
 public:
  // Listens before returning, so peers may connect at once. Throws ConfigError for
  // an empty token or a bind_address that is not an IPv4 literal, and naming
  // address:port when it cannot listen there (e.g. the port is in use).
  explicit StoreServer(StoreServerOptions options);
  // Stops the server's thread and closes every connection: clients then fail with
  // CommError, at once for a request in flight.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // Peers refused so far: a wrong token, not speaking the protocol, too slow to
  // finish the handshake, or arriving while too many others were mid-handshake.
  // Each is counted after on_refused has returned with its reason.
  std::int64_t refused() const;

 private:
  int port_ = 0;
  int wake_ = -1;  // writing a byte here stops the loop
  std::unique_ptr<ServerLoop> loop_;
  std::thread thread_;
};

}  // namespace cohort::store
