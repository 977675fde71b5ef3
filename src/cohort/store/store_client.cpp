#include "cohort/store/store_client.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cohort/errors.h"
#include "cohort/store/client_session.h"
#include "cohort/store/wire.h"

namespace cohort::store {
namespace {

using net::Clock;
using std::chrono::milliseconds;

// How much longer than the wait it asked the server for a request may take before
// the server counts as unresponsive (stopped, overloaded, or its host unreachable).
constexpr milliseconds kReplyMargin = std::chrono::seconds(5);

double seconds(milliseconds t) { return std::chrono::duration<double>(t).count(); }

std::string quoted(const std::vector<std::string>& keys) {
  std::vector<std::string> shown;
  for (std::size_t i = 0; i < keys.size() && i < 8; ++i) shown.push_back("'" + keys[i] + "'");
  auto out = fmt::format("{}", fmt::join(shown, ", "));
  if (keys.size() > shown.size()) out += fmt::format(" and {} more", keys.size() - shown.size());
  return out;
}

Request request(Op op, std::int64_t number, std::vector<std::string> keys, std::vector<Bytes> values = {}) {
  return Request{op, number, std::move(keys), std::move(values)};
}

// Whether `reply` has the shape that a reply to `r` must have.
bool well_formed(const Request& r, const Reply& reply) {
  if (reply.status == Status::kError) return reply.values.size() == 1;
  if (reply.status == Status::kTimeout)
    return r.op == Op::kGet || r.op == Op::kWait || r.op == Op::kMultiGet;
  switch (r.op) {
    case Op::kGet:
    case Op::kCompareSet: return reply.values.size() == 1;
    case Op::kMultiGet: return reply.values.size() == r.keys.size();
    default: return reply.values.empty();
  }
}

// How long a client whose request could not all be sent still looks for the
// server's answer (Note [Closing with an error]).
constexpr milliseconds kReplyAfterAFailedWrite = std::chrono::seconds(1);

// One whole reply frame's payload.
net::Io read_reply(tls::Session& tls, Bytes& payload, Clock::time_point deadline) {
  std::uint8_t header[kFrameHeaderSize];
  auto io = tls.read_exact(header, sizeof header, deadline);
  if (io != net::Io::kDone) return io;
  const auto size = framed_size(header);
  if (size > kMaxFramePayload) return net::Io::kFailed;
  payload.resize(size);
  return tls.read_exact(payload.data(), size, deadline);
}

}  // namespace

StoreClient::StoreClient(std::string host, int port, std::string token, milliseconds timeout,
                         Certificates certificates)
    : c10d::Store(timeout),
      host_(std::move(host)),
      port_(port),
      token_(std::move(token)),
      certificates_(std::move(certificates)) {
  if (token_.empty())
    throw ConfigError("cohort: the store token is empty\n  fix: pass the job's --rdzv-token / COHORT_RDZV_TOKEN");
  if (port_ <= 0 || port_ > 65535)
    throw ConfigError(fmt::format("cohort: store port {} is not in 1..65535", port_));
  if (timeout.count() <= 0)
    throw ConfigError("cohort: a store timeout must be > 0 (cohort bounds every wait)");
  session_ = std::make_unique<ClientSession>(open_session(host_, port_, token_, timeout, certificates_));
}

StoreClient::~StoreClient() = default;

milliseconds StoreClient::timeout() const {
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  return timeout_;
}

void StoreClient::setTimeout(const milliseconds& timeout) {
  if (timeout.count() <= 0)
    throw ConfigError("cohort: a store timeout must be > 0 (cohort bounds every wait; c10d reads 0 as forever)");
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  timeout_ = timeout;
}

void StoreClient::fail(const std::string& why, bool timed_out) {
  session_.reset();
  broken_ = why;
  if (timed_out) throw TimeoutError(why, "store request", {});
  throw CommError(why);
}

Reply StoreClient::call(const Request& r, milliseconds server_wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) throw CommError(broken_ + " (this client has been unusable since; make a new one)");
  const auto deadline = Clock::now() + server_wait + kReplyMargin;
  auto& tls = *session_->tls;
  auto bytes = frame(encode(r));
  auto io = tls.write_all(bytes.data(), bytes.size(), deadline);
  // Note [Closing with an error]: a server that refuses a request while still
  // receiving it answers and closes, so its answer may be here though the write failed.
  const bool written = io == net::Io::kDone;
  if (written || io == net::Io::kClosed || io == net::Io::kFailed) {
    Bytes payload;
    auto read = read_reply(tls, payload, written ? deadline : std::min(deadline, Clock::now() + kReplyAfterAFailedWrite));
    if (read == net::Io::kDone) {
      auto reply = decode_reply(payload);
      if (!reply || !well_formed(r, *reply))
        fail(fmt::format("cohort: the store at {}:{} sent a reply that makes no sense", host_, port_), false);
      if (reply->status == Status::kError) {
        std::string message(reply->values[0].begin(), reply->values[0].end());
        if (reply->number == kConnectionClosing || !written) {
          session_.reset();
          broken_ = message;
        }
        TORCH_CHECK(false, message);
      }
      if (written) return *reply;
    }
    if (written) io = read;
  }
  const char* error = std::strerror(errno);
  if (io == net::Io::kClosed)
    fail(fmt::format("cohort: the store at {}:{} closed the connection; its host (the agent that hosts the "
                     "rendezvous) has most likely exited\n  fix: see that agent's output",
                     host_, port_),
         false);
  if (io == net::Io::kTimedOut)
    fail(fmt::format("cohort: the store at {}:{} did not answer a {} request within {:.1f} s; its host is stopped, "
                     "overloaded or unreachable",
                     host_, port_, op_name(r.op), seconds(server_wait + kReplyMargin)),
         true);
  fail(fmt::format("cohort: the connection to the store at {}:{} failed: {}", host_, port_,
                   tls.error().empty() ? error : tls.error()),
       false);
}

void StoreClient::throw_timeout(const char* what, const std::vector<std::string>& keys, milliseconds timeout) const {
  throw TimeoutError(fmt::format("cohort: store {} timed out after {:.1f} s waiting for key{} {} at {}:{}\n  fix: "
                                 "check that whoever sets {} (a rank, or the agent) is running; raise the store "
                                 "timeout if it starts slowly",
                                 what, seconds(timeout), keys.size() == 1 ? "" : "s", quoted(keys), host_, port_,
                                 keys.size() == 1 ? "it" : "them"),
                     std::string("store ") + what, {});
}

void StoreClient::set(const std::string& key, const Bytes& value) {
  call(request(Op::kSet, 0, {key}, {value}), timeout());
}

Bytes StoreClient::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return call(request(Op::kCompareSet, 0, {key}, {expected, desired}), timeout()).values[0];
}

Bytes StoreClient::get(const std::string& key) {
  auto t = timeout();
  auto reply = call(request(Op::kGet, t.count(), {key}), t);
  if (reply.status == Status::kTimeout) throw_timeout("get", {key}, t);
  return reply.values[0];
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t value) {
  return call(request(Op::kAdd, value, {key}), timeout()).number;
}

bool StoreClient::deleteKey(const std::string& key) {
  return call(request(Op::kDelete, 0, {key}), timeout()).number != 0;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  return call(request(Op::kCheck, 0, keys), timeout()).number != 0;
}

std::int64_t StoreClient::getNumKeys() { return call(request(Op::kNumKeys, 0, {}), timeout()).number; }

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

void StoreClient::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  if (timeout.count() <= 0)
    throw ConfigError("cohort: a store wait needs a timeout > 0 (cohort bounds every wait; c10d reads 0 as forever)");
  auto reply = call(request(Op::kWait, timeout.count(), keys), timeout);
  if (reply.status == Status::kTimeout) throw_timeout("wait", reply.keys.empty() ? keys : reply.keys, timeout);
}

#if COHORT_C10D_STORE_HAS_EXTENDED_API
void StoreClient::append(const std::string& key, const Bytes& value) {
  call(request(Op::kAppend, 0, {key}, {value}), timeout());
}

std::vector<Bytes> StoreClient::multiGet(const std::vector<std::string>& keys) {
  auto t = timeout();
  auto reply = call(request(Op::kMultiGet, t.count(), keys), t);
  if (reply.status == Status::kTimeout) throw_timeout("multiGet", reply.keys.empty() ? keys : reply.keys, t);
  return std::move(reply.values);
}

void StoreClient::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  TORCH_CHECK(keys.size() == values.size(), "cohort: store multiSet got ", keys.size(), " keys but ", values.size(),
              " values");
  call(request(Op::kMultiSet, 0, keys, values), timeout());
}
#endif

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return c10::make_intrusive<StoreClient>(host_, port_, token_, timeout(), certificates_);
}

}  // namespace cohort::store
