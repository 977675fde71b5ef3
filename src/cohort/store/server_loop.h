#pragma once
// The store server's event loop: one thread, non-blocking sockets and epoll, so
// that no peer (slow, silent or hostile) can stall the others, and so that a
// wake-up costs what is ready, not what is open (Note [The loop's cost per
// wake-up]). StoreServer owns it and runs it on its thread; see Note [Store
// protocol] in store/wire.h.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cohort/store/deadlines.h"
#include "cohort/store/net.h"
#include "cohort/store/poller.h"
#include "cohort/store/store_server.h"
#include "cohort/store/table.h"
#include "cohort/store/tls.h"
#include "cohort/store/waiters.h"
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

// Note [The loop's cost per wake-up]: a big job keeps thousands of connections
// open, nearly all of them idle between rendezvous rounds, so the loop never walks
// all of them. Each piece of state it used to find by walking has an index that
// the loop keeps true as it goes (ServerLoop::sync, after every piece of work on a
// connection):
// - readiness: epoll, each connection registered once, with the events it wants
//   now (EPOLLIN while it reads, EPOLLOUT only while output or an OpenSSL write is
//   pending), changed with EPOLL_CTL_MOD only when that changes;
// - deadlines (a pending handshake's, a lingering close's, a parked request's): a
//   DeadlineQueue ordered by time; a wake-up looks at the expired ones, and
//   epoll_wait sleeps until the nearest;
// - parked requests: a WaiterIndex by key; a write retries exactly the requests
//   that name one of its keys (Note [Waking waiters by key]);
// - TLS plaintext already decrypted (Note [Buffered TLS plaintext]): a set of the
//   connections that hold some;
// - peers still to prove the token: an ordered map of at most
//   kMaxPendingHandshakes, walked to pick an eviction (Note [Pending handshakes
//   under a flood]).
// epoll is level-triggered: read_frames reads at most 16 records a wake-up so that
// one busy peer cannot starve the others, and what it leaves in the socket must be
// reported again; edge-triggered epoll would not report them, and would need a
// list of its own for every connection left with bytes in its socket, kept as
// carefully as buffered_ below. Level-triggered costs an EPOLL_CTL_MOD when a
// reply cannot be sent at once, which a client that reads its replies makes rare.
// A connection that dies is taken out of every index at once, but freed only at
// the end of the round, since the events epoll_wait returned may still name it; an
// event names a connection by id, never by pointer, so a late one finds nothing.
//
// Note [Buffered TLS plaintext]: OpenSSL reads ahead (tls.cpp): one recv() takes
// whatever the socket holds, up to its buffer, so a request costs the server one
// recv(), not one for a record's header and one for its body. What it took but has
// not handed out yet (decrypted plaintext, or whole records of a burst) is no
// longer in the socket, and epoll will not report it. Session::has_buffered()
// (SSL_has_pending) says so; such a connection waits in buffered_, and is read at
// the next round, which then does not sleep. SSL_has_pending is also true for part
// of a record whose rest only the socket can bring, which would spin the loop; so
// has_buffered() is false from a read that wanted the socket until one that got
// something, and epoll reports the rest when it comes. read_frames still reads on
// until the socket is empty (EAGAIN) or 16 records: stopping once OpenSSL held
// nothing more saved that last recv(), but with 1,024 busy clients sharing the
// server's 2 cores it cost clients and server more per operation (a client's next
// request, often there by then, waited for the next round; docs/scale.md).
//
// Note [Waking waiters by key]: a GET, WAIT or MULTI_GET whose keys are missing is
// parked under each of its keys (ServerLoop::park). A SET, COMPARE_SET, ADD,
// APPEND or MULTI_SET is the only thing that can make a key exist, so each of its
// keys that has waiters is noted, whether or not the write went through (a failed
// one wakes its waiters for nothing, and they park again); settle() retries the
// waiters of the noted keys, in accept order, and goes on while the requests they
// release write more. DELETE makes no key exist, so it wakes nobody. A request
// that still misses another of its keys stays parked under all of them.
inline constexpr int kEventsPerWait = 256;

// One peer, from accept() to close.
struct Connection {
  // Names it to epoll and the indexes: grows with accept order, never reused.
  std::uint64_t id = 0;
  // What it is registered for with epoll now.
  std::uint32_t events = 0;
  // Taken out of every index; freed at the end of the round.
  bool buried = false;
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
  // How many times the loop has served a connection (an event, buffered plaintext,
  // a deadline, a woken request), so a test can tell that idle connections cost
  // nothing (Note [The loop's cost per wake-up]).
  std::int64_t visits() const { return visits_.load(std::memory_order_relaxed); }
  // Requests parked now, waiting for keys.
  std::int64_t parked() const { return parked_.load(std::memory_order_relaxed); }

 private:
  void serve_events(Connection& c, std::uint32_t events);
  void serve_buffered();
  void pause_accepting();
  void resume_accepting(net::Clock::time_point now);
  Connection* find(std::uint64_t id);
  // Brings every index in line with the connection's state (Note [The loop's cost
  // per wake-up]); to be called after each piece of work on it.
  void sync(Connection& c);
  void park(Connection& c, Request request);
  void unpark(Connection& c);
  // A write of `request`'s keys may complete parked requests (Note [Waking waiters by key]).
  void note_write(const Request& request);
  void bury();
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
  int wait_timeout_ms() const;

  StoreServerOptions options_;
  tls::Context tls_;
  net::Fd listener_;
  net::Fd wake_;
  Table table_;
  Poller poller_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Connection>> connections_;
  std::uint64_t next_id_;
  DeadlineQueue deadlines_;
  WaiterIndex waiters_;
  std::vector<std::string> written_keys_;  // written this round, with waiters
  std::set<std::uint64_t> buffered_;       // Note [Buffered TLS plaintext]
  std::map<std::uint64_t, Connection*> pending_;  // still to prove the token, in accept order
  std::vector<std::uint64_t> buried_;      // dead, to free at the end of the round
  net::Clock::time_point accept_paused_until_{};
  bool accepting_ = true;        // the listener is registered for EPOLLIN
  bool accept_failing_ = false;  // reported; cleared by the next accept that works
  std::atomic<std::int64_t> refused_{0};
  std::atomic<std::int64_t> visits_{0};
  std::atomic<std::int64_t> parked_{0};
};

}  // namespace cohort::store
