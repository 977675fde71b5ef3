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

// Note [Pending handshakes under a flood]: a peer that connects and says nothing
// costs the server a slot until its handshake deadline (1 s by default). Anyone who
// reaches the port can open such peers faster than they expire, so a full table must
// never turn the newcomer away: it would be the job's own agent or worker as often as
// not. Instead the newcomer is always taken, and room is made by evicting the
// oldest pending peer of the source address holding the most pending slots (of its
// own source first, once that source holds kMaxPendingPerSource). A peer that holds
// the token answers within a round trip, long before 64 newer peers can push it out,
// because the loop accepts at most kAcceptsPerRound peers between two reads of the
// pending ones. An evicted peer that holds the token reconnects (StoreClient retries
// a dropped handshake within its timeout).
inline constexpr std::size_t kMaxPendingHandshakes = 256;
inline constexpr std::size_t kMaxPendingPerSource = 64;
inline constexpr int kAcceptsPerRound = 16;

// One peer, from accept() to close.
struct Connection {
  net::Fd fd;
  std::string peer;    // address:port
  std::string source;  // the address alone
  net::Clock::time_point accepted_at;
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
  void accept_some();
  void make_room_for(const std::string& source);
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
