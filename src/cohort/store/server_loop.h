#pragma once
// The store server's event loop: one thread, non-blocking sockets and poll(), so
// that no peer (slow, silent or hostile) can stall the others. StoreServer owns it
// and runs it on its thread; see Note [Store protocol] in store/wire.h.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/store/frame_cipher.h"
#include "cohort/store/net.h"
#include "cohort/store/store_server.h"
#include "cohort/store/table.h"

namespace cohort::store {

// Peers that have connected but not yet proved the token; more are refused at once.
inline constexpr std::size_t kMaxPendingHandshakes = 64;

// One peer, from accept() to close.
struct Connection {
  net::Fd fd;
  std::string peer;
  bool authenticated = false;
  bool dead = false;
  net::Clock::time_point handshake_deadline;
  Bytes server_nonce;
  Bytes in;   // received, not yet consumed
  Bytes out;  // to send, when the socket takes it
  std::unique_ptr<FrameSealer> sealer;
  std::unique_ptr<FrameOpener> opener;
  // The GET/WAIT/MULTI_GET waiting for keys, and until when. While one is parked the
  // connection's later frames wait, so replies keep the order of requests.
  std::optional<Request> parked;
  net::Clock::time_point parked_deadline;
};

class ServerLoop {
 public:
  // `listener` listens already; a byte written to the other end of `wake` ends run().
  ServerLoop(StoreServerOptions options, net::Fd listener, net::Fd wake);
  ~ServerLoop();

  // Serves until woken, then closes every connection.
  void run();

  std::int64_t refused() const { return refused_.load(); }

 private:
  void accept_all();
  void on_readable(Connection& c);
  void read_hello(Connection& c);
  void process_frames(Connection& c);
  void handle(Connection& c, Request request);
  void reply(Connection& c, const Reply& r);
  void flush(Connection& c);
  void refuse(Connection& c, const std::string& reason, int verdict);
  void count_refusal(const std::string& reason);
  void expire(net::Clock::time_point now);
  void settle();
  int poll_timeout_ms() const;

  StoreServerOptions options_;
  net::Fd listener_;
  net::Fd wake_;
  Table table_;
  std::uint64_t settled_generation_ = 0;
  std::vector<std::unique_ptr<Connection>> connections_;
  net::Clock::time_point accept_paused_until_{};
  std::atomic<std::int64_t> refused_{0};
};

}  // namespace cohort::store
