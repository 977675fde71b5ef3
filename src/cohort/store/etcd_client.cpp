#include "cohort/store/etcd_client_internal.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "cohort/errors.h"
#include "cohort/store/etcd_request_internal.h"

namespace cohort::store {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Note [curl's global init]: curl_global_init is not thread-safe on every libcurl,
// and curl_easy_init calls it on first use, so the first call is made once here,
// before any handle exists, whichever thread makes the first client.
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string with_scheme(const std::string& endpoint, bool tls) {
  std::string url = endpoint;
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0) url = (tls ? "https://" : "http://") + url;
  while (url.back() == '/') url.pop_back();
  return url;
}

}  // namespace

EtcdClient::EtcdClient(EtcdStoreOptions options) : options_(std::move(options)) {
  validate(options_);
  init_curl_once();
  const auto& c = options_.certificates();
  const bool tls = !c.ca_file.empty() || !c.cert_file.empty();
  for (const auto& e : options_.endpoints()) urls_.push_back(with_scheme(e, tls));
}

EtcdClient::~EtcdClient() {
  for (void* h : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(h));
}

std::string EtcdClient::members() const { return fmt::format("[{}]", fmt::join(options_.endpoints(), ", ")); }

std::string EtcdClient::token(const std::string& stale, const std::string& what, Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(token_mutex_);
  if (options_.user().empty() || auth_disabled_) return "";
  if (!token_.empty() && token_ != stale) return token_;
  token_.clear();
  const auto body =
      nlohmann::json{{"name", options_.user()}, {"password", options_.password()}}.dump();
  std::vector<Said> said(urls_.size());
  const auto start = Clock::now();
  const bool served = in_turn(deadline, said, [&](std::size_t m) {
    auto a = attempt(m, "/v3/auth/authenticate", body, "", deadline);
    if (a.kind == Attempt::Kind::kOk) {
      token_ = a.reply.value("token", "");
      return Turn::kServed;
    }
    if (a.kind != Attempt::Kind::kUnavailable) {
      if (mentions(a.why, "authentication is not enabled")) {
        auth_disabled_ = true;
        return Turn::kServed;
      }
      throw ConfigError(fmt::format(
          "cohort: etcd auth refused user '{}' at {} (needed for {}): {}\n  fix: check the etcd user "
          "(`--rdzv-conf user=`) and its password (COHORT_ETCD_PASSWORD) given to cohort (etcdctl user get {} "
          "shows the user)",
          options_.user(), options_.endpoints()[m], what, a.why, options_.user()));
    }
    if (a.tls || !said[m].tls) said[m] = {a.why, a.tls};  // a TLS failure is the one to show
    return Turn::kNext;
  });
  if (served) return token_;
  fail_all(fmt::format("authentication of user '{}' (for {})", options_.user(), what), said, start);
}

bool EtcdClient::in_turn(Clock::time_point deadline, const std::vector<Said>& said,
                         const std::function<Turn(std::size_t)>& visit) {
  auto backoff = milliseconds(50);
  while (true) {
    const auto first = preferred_.load();
    for (std::size_t i = 0; i < urls_.size(); ++i) {
      // Past the deadline the rest of the round is not tried; they keep what they
      // said last round.
      if (i > 0 && Clock::now() >= deadline) break;
      const auto m = (first + i) % urls_.size();
      const auto turn = visit(m);
      if (turn == Turn::kServed) {
        preferred_ = m;
        return true;
      }
      if (turn == Turn::kAgain) --i;
      // Note [A member that hangs]: the next call starts past a member that did not
      // serve, so that one that holds requests for request_timeout (stopped, a stuck
      // disk) costs this client that once, not at every call.
      if (turn == Turn::kNext) {
        auto failed = m;
        preferred_.compare_exchange_strong(failed, (m + 1) % urls_.size());
      }
    }
    // Note [TLS failures are the configuration's]: no point in going round again.
    if (std::all_of(said.begin(), said.end(), [](const Said& x) { return x.tls; })) return false;
    if (Clock::now() + backoff >= deadline) return false;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
}

void EtcdClient::fail_all(const std::string& what, const std::vector<Said>& said, Clock::time_point start) const {
  std::vector<std::string> each;
  bool all_tls = true;
  for (std::size_t m = 0; m < urls_.size(); ++m) {
    each.push_back(options_.endpoints()[m] + ": " + said[m].why);
    all_tls = all_tls && said[m].tls;
  }
  // Note [TLS failures are the configuration's]: a member that refuses this
  // client's TLS, or whose certificate the CA does not vouch for, is a
  // misconfiguration when every member does it, not a lost quorum.
  if (all_tls)
    throw ConfigError(fmt::format(
        "cohort: etcd: no member of {} would make a TLS session for the {}: {}\n  fix: check the etcd store's CA, "
        "client certificate and key, and that the endpoints' scheme (http:// or https://) is the members' own",
        members(), what, fmt::join(each, "; ")));
  // A member not reached before the deadline says nothing of the quorum: one that
  // hangs held the whole of it (Note [A member that hangs]).
  const Said untried;
  if (std::any_of(said.begin(), said.end(), [&](const Said& x) { return x.why == untried.why; }))
    throw CommError(fmt::format(
        "cohort: etcd: no member of {} served the {} within {:.1f} s, and some were not reached before that "
        "deadline; {}\n  a member that hangs holds each request for request_timeout ({:.1f} s)\n  fix: check the "
        "members (etcdctl endpoint health --cluster), or give the store a failover_timeout that covers a "
        "request_timeout per member",
        members(), what, seconds(Clock::now() - start), fmt::join(each, "; "),
        seconds(options_.request_timeout())));
  throw CommError(fmt::format(
      "cohort: etcd: no member of {} could serve the {} within {:.1f} s; {}\n  the etcd cluster has most likely "
      "lost its quorum (a majority of its members down or cut off), or none of these members is running\n  "
      "fix: check the members (etcdctl endpoint health --cluster) and bring a majority back; the job's store "
      "cannot work without etcd's quorum",
      members(), what, seconds(Clock::now() - start), fmt::join(each, "; ")));
}

nlohmann::json EtcdClient::call(const std::string& path, const nlohmann::json& request, const std::string& what) {
  const auto start = Clock::now();
  const auto deadline = start + options_.failover_timeout();
  const auto body = request.dump();
  auto token = this->token("", what, deadline);
  int authentications = 0;
  std::vector<Said> said(urls_.size());
  nlohmann::json reply;
  const bool served = in_turn(deadline, said, [&](std::size_t m) {
    auto a = attempt(m, path, body, token, deadline);
    switch (a.kind) {
      case Attempt::Kind::kOk:
        reply = std::move(a.reply);
        return Turn::kServed;
      case Attempt::Kind::kUnavailable:
        if (a.tls || !said[m].tls) said[m] = {a.why, a.tls};  // a TLS failure is the one to show
        return Turn::kNext;
      case Attempt::Kind::kUnauthenticated:
        // Tokens expire (etcd's --auth-token-ttl, 5 min), and all are dropped
        // when auth is turned off and on: authenticate again, retry this member.
        if (++authentications > 3)
          throw ConfigError(fmt::format("cohort: etcd at {} keeps refusing the auth token of user '{}' for {}: {}",
                                        options_.endpoints()[m], options_.user(), what, a.why));
        token = this->token(token, what, deadline);
        return Turn::kAgain;
      case Attempt::Kind::kRefused: break;
    }
    const auto& at = options_.endpoints()[m];
    if (mentions(a.why, "user name is empty") || a.code == kUnauthenticated)
      throw ConfigError(fmt::format("cohort: etcd at {} requires authentication (etcd auth is enabled) and "
                                    "refused {}: {}\n  fix: pass an etcd user and its password: `cohort run --rdzv-conf user=NAME` "
                                    "with the password in COHORT_ETCD_PASSWORD, or EtcdStoreOptions::user() and "
                                    "password() in code",
                                    at, what, a.why));
    if (a.code == kPermissionDenied)
      throw ConfigError(fmt::format(
          "cohort: etcd user '{}' may not make the {} at {}: {}\n  fix: grant the user's role readwrite on the "
          "prefix (etcdctl role grant-permission ROLE --prefix=true readwrite '{}')",
          options_.user(), what, at, a.why, options_.prefix()));
    if (a.code == kResourceExhausted || mentions(a.why, "too large"))
      throw ConfigError(fmt::format("cohort: etcd at {} refused the {} as too large: {}\n  fix: keep values "
                                    "small, or raise the members' --max-request-bytes (1.5 MiB by default)",
                                    at, what, a.why));
    throw CommError(fmt::format("cohort: etcd at {} refused the {}: {}", at, what, a.why));
  });
  if (!served) fail_all(what, said, start);
  return reply;
}

}  // namespace cohort::store
