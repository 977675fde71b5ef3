#include "cohort/store/server_loop.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>

#include <fmt/core.h>
#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::store {

using net::Clock;

namespace {
// epoll ids of the two descriptors that are not connections; a connection's id is
// above them.
constexpr std::uint64_t kWakeId = 0;
constexpr std::uint64_t kListenerId = 1;
}  // namespace

ServerLoop::ServerLoop(StoreServerOptions options, net::Fd listener, net::Fd wake)
    : options_(std::move(options)),
      tls_(tls::Role::kServer, options_.token(), options_.certificates()),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      table_(TableOptions()
                 .max_value_bytes(options_.max_value_bytes())
                 .max_table_bytes(options_.max_table_bytes())
                 .max_reply_bytes(std::min(kMaxFramePayload, options_.max_buffer_bytes() - kFrameHeaderSize))),
      next_id_(kListenerId + 1) {
  if (!poller_.add(wake_.get(), EPOLLIN, kWakeId) || !poller_.add(listener_.get(), EPOLLIN, kListenerId))
    throw CommError(fmt::format("cohort: the store could not register its listener with epoll: {}",
                                std::strerror(errno)));
}

ServerLoop::~ServerLoop() = default;

// Note [The loop's cost per wake-up].
void ServerLoop::run() {
  try {
    std::vector<epoll_event> ready(kEventsPerWait);
    for (;;) {
      resume_accepting(Clock::now());
      const int n = poller_.wait(ready, wait_timeout_ms());
      bool woken = false, acceptable = false;
      for (int i = 0; i < n; ++i) {
        woken |= ready[i].data.u64 == kWakeId;
        acceptable |= ready[i].data.u64 == kListenerId;
      }
      if (woken) break;
      for (int i = 0; i < n; ++i) {
        auto* c = find(ready[i].data.u64);
        if (!c || c->dead) continue;
        serve_events(*c, ready[i].events);
        sync(*c);
      }
      serve_buffered();
      if (acceptable && accepting_) accept_some();
      expire(Clock::now());
      settle();
      bury();
    }
  } catch (const std::exception& e) {
    // Closing every connection below turns this into CommError at each client.
    std::cerr << "cohort: the key-value store server stopped: " << e.what() << std::endl;
  }
  connections_.clear();
  listener_.reset();
}

void ServerLoop::serve_events(Connection& c, std::uint32_t events) {
  visits_.fetch_add(1, std::memory_order_relaxed);
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
  if (c.dead || !(events & EPOLLOUT)) return;
  if (!c.authenticated) {
    if (c.tls) continue_handshake(c);
  } else {
    flush(c);
    if (!c.dead && !c.closing) read_frames(c);  // a read that waited for the socket to take a write
  }
}

// Note [Buffered TLS plaintext]: the connections whose plaintext OpenSSL holds are
// read without waiting for their sockets.
void ServerLoop::serve_buffered() {
  if (buffered_.empty()) return;
  const std::vector<std::uint64_t> ids(buffered_.begin(), buffered_.end());
  for (auto id : ids) {
    auto* c = find(id);
    if (!c || c->dead) continue;
    if (c->authenticated && !c->closing && c->tls->has_buffered()) {
      visits_.fetch_add(1, std::memory_order_relaxed);
      on_readable(*c);
    }
    sync(*c);
  }
}

Connection* ServerLoop::find(std::uint64_t id) {
  auto it = connections_.find(id);
  return it == connections_.end() ? nullptr : it->second.get();
}

namespace {
// Still to prove the token (a PSK binder, or with certificates the PROVE request):
// counted and evictable under Note [Pending handshakes under a flood].
bool is_pending(const Connection& c) { return !c.dead && !c.proved && (!c.authenticated || c.awaiting_proof); }

// The one deadline that governs `c` now, in the order expire() acts on them.
std::optional<Clock::time_point> deadline_of(const Connection& c) {
  if (c.lingering) return c.linger_until;
  if (!c.authenticated || c.awaiting_proof) return c.handshake_deadline;
  if (c.parked) return c.parked_deadline;
  return std::nullopt;
}
}  // namespace

void ServerLoop::sync(Connection& c) {
  if (c.dead) {
    if (c.buried) return;
    c.buried = true;
    poller_.remove(c.fd.get());
    deadlines_.clear(c.id);
    buffered_.erase(c.id);
    pending_.erase(c.id);
    unpark(c);
    buried_.push_back(c.id);
    return;
  }
  const bool sending = !c.out.empty() || c.want_write;
  const bool reading = !c.closing || c.lingering;
  const std::uint32_t events = (reading ? EPOLLIN : 0u) | (sending ? EPOLLOUT : 0u);
  if (events != c.events) {
    poller_.modify(c.fd.get(), events, c.id);
    c.events = events;
  }
  if (auto at = deadline_of(c))
    deadlines_.set(c.id, *at);
  else
    deadlines_.clear(c.id);
  if (c.authenticated && !c.closing && c.tls->has_buffered())
    buffered_.insert(c.id);
  else
    buffered_.erase(c.id);
  if (is_pending(c))
    pending_.emplace(c.id, &c);
  else
    pending_.erase(c.id);
}

void ServerLoop::bury() {
  for (auto id : buried_) connections_.erase(id);
  buried_.clear();
}

int ServerLoop::wait_timeout_ms() const {
  if (!buffered_.empty()) return 0;
  auto next = deadlines_.next().value_or(Clock::time_point::max());
  if (!accepting_) next = std::min(next, accept_paused_until_);
  return next == Clock::time_point::max() ? -1 : net::poll_timeout(next);
}

// Note [Out of descriptors]: a listener left registered would stay readable and
// spin the loop, so it leaves epoll's interest until the pause is over.
void ServerLoop::pause_accepting() {
  accept_paused_until_ = Clock::now() + kAcceptBackoff;
  if (!accepting_) return;
  poller_.modify(listener_.get(), 0, kListenerId);
  accepting_ = false;
}

void ServerLoop::resume_accepting(Clock::time_point now) {
  if (accepting_ || now < accept_paused_until_) return;
  poller_.modify(listener_.get(), EPOLLIN, kListenerId);
  accepting_ = true;
}

void ServerLoop::accept_some() {
  for (int round = 0; round < kAcceptsPerRound; ++round) {
    sockaddr_in address{};
    socklen_t size = sizeof address;
    net::Fd fd(::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&address), &size,
                         SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      // Note [Out of descriptors]: the listener would stay readable and spin the loop,
      // so stop accepting for a moment instead, and say so once per burst.
      if (err != EAGAIN && err != EWOULDBLOCK) {
        pause_accepting();
        if (!accept_failing_) report_accept_failure(err);
        accept_failing_ = true;
      }
      return;
    }
    if (accept_failing_) {
      accept_failing_ = false;
      std::cerr << "cohort: the key-value store accepts connections again" << std::endl;
    }
    auto peer = net::address_name(address);
    auto source = peer.substr(0, peer.rfind(':'));
    make_room_for(source);
    net::set_nodelay(fd.get());
    auto c = std::make_unique<Connection>();
    c->id = next_id_++;
    c->fd = std::move(fd);
    c->peer = peer;
    c->source = source;
    c->accepted_at = Clock::now();
    c->handshake_deadline = c->accepted_at + options_.handshake_timeout();
    c->events = EPOLLIN;
    if (!poller_.add(c->fd.get(), c->events, c->id)) {
      // At fs.epoll.max_user_watches, or out of kernel memory: like a full
      // descriptor table, the peer is dropped and may come back.
      fmt::print(stderr, "cohort: the key-value store dropped {}: epoll_ctl(): {}\n", peer, std::strerror(errno));
      std::fflush(stderr);
      continue;
    }
    auto& added = *c;
    connections_.emplace(c->id, std::move(c));
    sync(added);
  }
}

// Note [Out of descriptors]: at its open-files limit (EMFILE) the store cannot take a
// connection; peers then wait in the listen backlog and give up with a timeout that
// blames the store's host. The hosting agent raises its soft limit to the hard one at
// start (raise_open_files_limit in launcher/worker_process.h); should it still run out,
// the store says so loudly, naming the limit and the fix, keeps serving the
// connections it has, and retries every kAcceptBackoff.
void ServerLoop::report_accept_failure(int err) {
  rlimit limit{};
  std::string limits = "unknown";
  auto text = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0)
    limits = fmt::format("soft {}, hard {}", text(limit.rlim_cur), text(limit.rlim_max));
  std::string fix =
      err == EMFILE
          ? fmt::format("raise the open-files limit of the hosting process (RLIMIT_NOFILE: {}), e.g. `ulimit -n` "
                        "in its shell or LimitNOFILE= in its systemd unit; each worker holds about 2 connections",
                        limits)
      : err == ENFILE ? std::string("the whole system is out of file descriptors (fs.file-max); close some or raise it")
                      : std::string("free memory or descriptors on the store's host");
  // Through stdio, not iostreams: with every descriptor taken, UBSan's check of a
  // virtual call on std::cerr cannot read the process's maps and aborts the store.
  fmt::print(stderr,
             "cohort: the key-value store cannot accept connections: accept(): {}; it keeps serving "
             "the {} it has and retries every {} ms, while new peers wait\n  fix: {}\n",
             std::strerror(err), connections_.size(),
             std::chrono::duration_cast<std::chrono::milliseconds>(kAcceptBackoff).count(), fix);
  std::fflush(stderr);
}

// Note [Pending handshakes under a flood]. It walks pending_ alone, at most
// kMaxPendingHandshakes peers in accept order, never every connection.
void ServerLoop::make_room_for(const std::string& source) {
  std::map<std::string, std::size_t> per_source;
  std::size_t pending = 0;
  for (const auto& [id, c] : pending_) {
    if (!is_pending(*c)) continue;
    ++per_source[c->source];
    ++pending;
  }
  // Among the sources that hold the most pending slots, the oldest pending peer goes:
  // a tie is never decided by how an address sorts, which a flood could choose so
  // that the job's own hosts always lose (Note [Pending handshakes under a flood]).
  std::size_t most = 0;
  if (per_source[source] >= kMaxPendingPerSource) {
    most = per_source[source];
  } else if (pending >= kMaxPendingHandshakes) {
    for (const auto& [name, count] : per_source) most = std::max(most, count);
  } else {
    return;
  }
  const bool own_source = per_source[source] >= kMaxPendingPerSource;
  Connection* oldest = nullptr;
  for (const auto& [id, c] : pending_) {
    if (!is_pending(*c) || (own_source ? c->source != source : per_source[c->source] != most)) continue;
    if (!oldest || c->accepted_at < oldest->accepted_at) oldest = c;
  }
  const std::string victim_source = oldest ? oldest->source : source;
  if (oldest) {
    refuse(*oldest,
           fmt::format("evicted to make room: {} peers were mid-handshake ({} from {}); the newest are kept", pending,
                       per_source[victim_source], victim_source));
    sync(*oldest);
  }
}

// The count goes up after the report is delivered, so whoever sees refused() reach N
// has N reports in hand (a test reads both from another thread).
void ServerLoop::count_refusal(const std::string& reason) {
  if (options_.on_refused()) {
    try {
      options_.on_refused()(reason);
    } catch (const std::exception& e) {
      std::cerr << "cohort: the store's on_refused callback threw: " << e.what() << std::endl;
    }
  }
  ++refused_;
}

// Only the connections whose deadline has passed (Note [The loop's cost per wake-up]).
void ServerLoop::expire(Clock::time_point now) {
  for (auto id : deadlines_.due(now)) {
    auto* c = find(id);
    if (!c || c->dead) continue;
    visits_.fetch_add(1, std::memory_order_relaxed);
    if (c->lingering) {
      c->dead = true;
    } else if (!c->authenticated || c->awaiting_proof) {
      refuse(*c, fmt::format("it did not finish the handshake within {:.1f} s",
                             std::chrono::duration<double>(options_.handshake_timeout()).count()));
    } else if (c->parked) {
      Reply r;
      r.status = Status::kTimeout;
      r.keys = table_.missing(c->parked->keys);
      unpark(*c);
      reply(*c, r);
      process_frames(*c);
    }
    sync(*c);
  }
}

void ServerLoop::park(Connection& c, Request request) {
  // A year bounds the deadline arithmetic; the client bounds the wait it asked for.
  auto wait = std::chrono::milliseconds(std::clamp<std::int64_t>(request.number, 0, 365LL * 24 * 3600 * 1000));
  c.parked_deadline = Clock::now() + wait;
  c.parked = std::move(request);
  waiters_.add(c.id, c.parked->keys);
  parked_.fetch_add(1, std::memory_order_relaxed);
}

void ServerLoop::unpark(Connection& c) {
  if (!c.parked) return;
  waiters_.remove(c.id, c.parked->keys);
  c.parked.reset();
  parked_.fetch_sub(1, std::memory_order_relaxed);
}

// Note [Waking waiters by key].
void ServerLoop::note_write(const Request& request) {
  switch (request.op) {
    case Op::kSet:
    case Op::kCompareSet:
    case Op::kAdd:
    case Op::kAppend:
    case Op::kMultiSet:
      for (const auto& key : request.keys)
        if (waiters_.has_waiters(key)) written_keys_.push_back(key);
      return;
    default:
      return;
  }
}

// Retries the requests parked on the keys written this round (Note [Waking waiters
// by key]), while the requests it releases write again.
void ServerLoop::settle() {
  while (!written_keys_.empty()) {
    auto keys = std::move(written_keys_);
    written_keys_.clear();
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    for (const auto& key : keys) {
      for (auto id : waiters_.of(key)) {
        auto* c = find(id);
        if (!c || c->dead || !c->parked) continue;
        visits_.fetch_add(1, std::memory_order_relaxed);
        if (auto r = table_.apply(*c->parked)) {
          unpark(*c);
          reply(*c, *r);
          process_frames(*c);
        }
        sync(*c);
      }
    }
  }
}

}  // namespace cohort::store
