#include "cohort/store/server_loop.h"

#include <errno.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>

#include <fmt/core.h>
#include <fmt/format.h>


namespace cohort::store {

using net::Clock;

ServerLoop::ServerLoop(StoreServerOptions options, net::Fd listener, net::Fd wake)
    : options_(std::move(options)),
      tls_(tls::Role::kServer, options_.token(), options_.certificates()),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      table_(TableOptions()
                 .max_value_bytes(options_.max_value_bytes())
                 .max_table_bytes(options_.max_table_bytes())
                 .max_reply_bytes(std::min(kMaxFramePayload, options_.max_buffer_bytes() - kFrameHeaderSize))) {}

ServerLoop::~ServerLoop() = default;

void ServerLoop::run() {
  try {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listener_.get(), static_cast<short>(Clock::now() >= accept_paused_until_ ? POLLIN : 0), 0});
      for (auto& c : connections_) {
        const bool sending = !c->out.empty() || c->want_write;
        const bool reading = !c->closing || c->lingering;
        fds.push_back({c->fd.get(), static_cast<short>((reading ? POLLIN : 0) | (sending ? POLLOUT : 0)), 0});
      }
      if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR)
        throw std::runtime_error(std::string("poll(): ") + std::strerror(errno));
      if (fds[0].revents != 0) break;
      for (std::size_t i = 2; i < fds.size(); ++i) {
        auto& c = *connections_[i - 2];
        // Plaintext that OpenSSL decrypted but read_frames left for this round.
        const bool buffered = c.authenticated && !c.closing && c.tls->has_buffered();
        if (buffered || (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) on_readable(c);
        if (c.dead || !(fds[i].revents & POLLOUT)) continue;
        if (!c.authenticated) {
          if (c.tls) continue_handshake(c);
        } else {
          flush(c);
          if (!c.dead && !c.closing) read_frames(c);  // a read that waited for the socket to take a write
        }
      }
      if (fds[1].revents & POLLIN) accept_some();
      expire(Clock::now());
      settle();
      connections_.erase(std::remove_if(connections_.begin(), connections_.end(), [](auto& c) { return c->dead; }),
                         connections_.end());
    }
  } catch (const std::exception& e) {
    // Closing every connection below turns this into CommError at each client.
    std::cerr << "cohort: the key-value store server stopped: " << e.what() << std::endl;
  }
  connections_.clear();
  listener_.reset();
}

int ServerLoop::poll_timeout_ms() const {
  auto next = Clock::time_point::max();
  if (Clock::now() < accept_paused_until_) next = accept_paused_until_;
  for (const auto& c : connections_) {
    if (c->authenticated && !c->closing && c->tls->has_buffered()) return 0;
    if (!c->authenticated || c->awaiting_proof) next = std::min(next, c->handshake_deadline);
    if (c->parked) next = std::min(next, c->parked_deadline);
    if (c->lingering) next = std::min(next, c->linger_until);
  }
  return next == Clock::time_point::max() ? -1 : net::poll_timeout(next);
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
        accept_paused_until_ = Clock::now() + kAcceptBackoff;
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
    c->fd = std::move(fd);
    c->peer = peer;
    c->source = source;
    c->accepted_at = Clock::now();
    c->handshake_deadline = c->accepted_at + options_.handshake_timeout();
    connections_.push_back(std::move(c));
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

namespace {
// Still to prove the token (a PSK binder, or with certificates the PROVE request):
// counted and evictable under Note [Pending handshakes under a flood].
bool is_pending(const Connection& c) { return !c.dead && !c.proved && (!c.authenticated || c.awaiting_proof); }
}  // namespace

// Note [Pending handshakes under a flood].
void ServerLoop::make_room_for(const std::string& source) {
  std::map<std::string, std::size_t> per_source;
  std::size_t pending = 0;
  for (const auto& c : connections_) {
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
  for (auto& c : connections_) {
    if (!is_pending(*c) || (own_source ? c->source != source : per_source[c->source] != most)) continue;
    if (!oldest || c->accepted_at < oldest->accepted_at) oldest = c.get();
  }
  const std::string victim_source = oldest ? oldest->source : source;
  if (oldest)
    refuse(*oldest,
           fmt::format("evicted to make room: {} peers were mid-handshake ({} from {}); the newest are kept", pending,
                       per_source[victim_source], victim_source));
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

void ServerLoop::expire(Clock::time_point now) {
  for (auto& c : connections_) {
    if (c->dead) continue;
    if (c->lingering) {
      if (now >= c->linger_until) c->dead = true;
    } else if ((!c->authenticated || c->awaiting_proof) && now >= c->handshake_deadline) {
      refuse(*c, fmt::format("it did not finish the handshake within {:.1f} s",
                             std::chrono::duration<double>(options_.handshake_timeout()).count()));
    } else if (c->parked && now >= c->parked_deadline) {
      Reply r;
      r.status = Status::kTimeout;
      r.keys = table_.missing(c->parked->keys);
      c->parked.reset();
      reply(*c, r);
      process_frames(*c);
    }
  }
}

// Retries parked requests while writes keep happening: a request released here may
// be followed by frames that write again.
void ServerLoop::settle() {
  while (table_.generation() != settled_generation_) {
    settled_generation_ = table_.generation();
    for (auto& c : connections_) {
      if (c->dead || !c->parked) continue;
      if (auto r = table_.apply(*c->parked)) {
        c->parked.reset();
        reply(*c, *r);
        process_frames(*c);
      }
    }
  }
}

}  // namespace cohort::store
