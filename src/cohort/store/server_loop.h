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

#include "cohort/store/net.h"
#include "cohort/store/store_server.h"
#include "cohort/store/table.h"
#include "cohort/store/tls.h"
#include "cohort/store/wire.h"

namespace cohort::store {

// Note [Pending handshakes under a flood]: a peer that connects and says nothing
// costs the server a slot until its handshake deadline (1 s by default). Anyone who
// reaches the port can open such peers faster than they expire, so a full table must
// never turn the newcomer away: it would be the job's own agent or worker as often as
// not. Instead the newcomer is always taken, and room is made by evicting the
// oldest pending peer of the source addresses holding the most pending slots (of its
// own source first, once that source holds kMaxPendingPerSource). Ties between
// sources go against the oldest peer, never by how an address sorts: a flood from
// many addresses could otherwise pick addresses that sort after the job's hosts. A peer that holds
// the token answers within a round trip, long before 64 newer peers can push it out,
// because the loop accepts at most kAcceptsPerRound peers between two reads of the
// pending ones. An evicted peer that holds the token reconnects (StoreClient retries
// a dropped handshake within its timeout). A peer whose PSK binder has verified
// has proved the token and is no longer counted or evicted: its TLS handshake is
// over on its side, and it would take a later close for a refusal.
inline constexpr std::size_t kMaxPendingHandshakes = 256;
inline constexpr std::size_t kMaxPendingPerSource = 64;
inline constexpr int kAcceptsPerRound = 16;
// With certificates, what a peer may send before it has proved the token: one PROVE
// request is under 100 bytes.
inline constexpr std::size_t kBeforeProofBytes = 4096;
// Out of descriptors: how long accepting pauses before the next try (Note [Out of
// descriptors] in server_loop.cpp).
inline constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

// Note [Buffers per connection]: a client has one request in flight per connection
// and reads each reply before it sends the next request. So the server never needs
// to hold more than one request's bytes from a peer, nor more than one reply for
// it; StoreServerOptions::max_buffer_bytes bounds both. A token holder that sends
// while its own request is parked, or stops reading its replies, passes the bound
// and is cut off with an error naming it, instead of growing the store's memory.
//
// Note [Closing with an error]: a connection that broke a limit gets one error
// reply, in place of the reply it awaits, and is then closed. Closing a socket with
// unread input makes the kernel send a reset, which can destroy that reply at the
// client before it is read; so once the reply is sent the server half-closes, and
// reads and drops the peer's input for up to kLinger (no more than that, and
// nothing kept), until the peer closes too.
inline constexpr auto kLinger = std::chrono::seconds(1);

// One peer, from accept() to close.
struct Connection {
  net::Fd fd;
  std::string peer;    // address:port
  std::string source;  // the address alone
  net::Clock::time_point accepted_at;
  std::unique_ptr<tls::Session> tls;  // made once the first byte says TLS
  // Its PSK binder verified: it holds the token, only its Finished is still to come.
  // Never evicted (Note [Pending handshakes under a flood]).
  // With certificates: its PROVE request checked out (Note [Certificates and the
  // token] in store/certificates.h); a valid certificate alone is not enough.
  bool proved = false;
  bool authenticated = false;
  // With certificates: the TLS handshake is done, the token's proof (the session's
  // first request, PROVE) is still to come, within the handshake deadline.
  bool awaiting_proof = false;
  bool dead = false;
  // Replying with an error, then closing (Note [Closing with an error]).
  bool closing = false;
  bool lingering = false;  // the error is sent; input is read and dropped until then
  net::Clock::time_point linger_until;
  // OpenSSL needs the socket writable to go on (the handshake, or a write it began).
  bool want_write = false;
  net::Clock::time_point handshake_deadline;
  Bytes in;   // received, not yet consumed
  Bytes out;  // to send, when the socket takes it
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
  void report_accept_failure(int err);
  void on_readable(Connection& c);
  void start_tls(Connection& c);
  void continue_handshake(Connection& c);
  void read_frames(Connection& c);
  void process_frames(Connection& c);
  void fail_connection(Connection& c, const std::string& message);
  void drop_input(Connection& c);
  void handle(Connection& c, Request request);
  void check_proof(Connection& c, const Request& request);
  void reply(Connection& c, const Reply& r);
  void flush(Connection& c);
  void refuse(Connection& c, const std::string& reason);
  void count_refusal(const std::string& reason);
  void expire(net::Clock::time_point now);
  void settle();
  int poll_timeout_ms() const;

  StoreServerOptions options_;
  tls::Context tls_;
  net::Fd listener_;
  net::Fd wake_;
  Table table_;
  std::uint64_t settled_generation_ = 0;
  std::vector<std::unique_ptr<Connection>> connections_;
  net::Clock::time_point accept_paused_until_{};
  bool accept_failing_ = false;  // reported; cleared by the next accept that works
  std::atomic<std::int64_t> refused_{0};
};

}  // namespace cohort::store
