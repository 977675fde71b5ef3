#include "cohort/store/etcd_client_internal.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "cohort/errors.h"

namespace cohort::store {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// gRPC's status codes, which the gateway passes on in its error replies.
constexpr int kInvalidArgument = 3;
constexpr int kPermissionDenied = 7;
constexpr int kResourceExhausted = 8;
constexpr int kFailedPrecondition = 9;
constexpr int kUnauthenticated = 16;

// No reply of etcd's comes near this; a member sending more is not etcd.
constexpr std::size_t kMaxReplyBytes = std::size_t{512} << 20;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::size_t append_reply(char* data, std::size_t size, std::size_t count, void* out) {
  auto& reply = *static_cast<std::string*>(out);
  if (reply.size() + size * count > kMaxReplyBytes) return 0;  // curl then fails the transfer
  reply.append(data, size * count);
  return size * count;
}

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

struct EtcdClient::Attempt {
  enum class Kind { kOk, kUnavailable, kUnauthenticated, kRefused };
  Kind kind = Kind::kUnavailable;
  nlohmann::json reply;
  std::string why;  // what the member said, for messages
  int code = 0;     // gRPC's status code of an error reply
  bool tls = false;  // no TLS session: certificates, or a scheme the member does not speak
};

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

void* EtcdClient::take_handle() {
  {
    std::lock_guard<std::mutex> lock(handles_mutex_);
    if (!idle_handles_.empty()) {
      void* h = idle_handles_.back();
      idle_handles_.pop_back();
      return h;
    }
  }
  CURL* h = curl_easy_init();
  if (!h) throw CommError("cohort: etcd: libcurl could not make a handle (out of memory?)");
  return h;
}

void EtcdClient::give_handle(void* handle) {
  std::lock_guard<std::mutex> lock(handles_mutex_);
  idle_handles_.push_back(handle);
}

EtcdClient::Attempt EtcdClient::attempt(std::size_t member, const std::string& path, const std::string& body,
                                        const std::string& token, Clock::time_point deadline) {
  Attempt a;
  const auto left = std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  const auto request_timeout = std::min(options_.request_timeout(), left);
  const auto connect_timeout = std::min(options_.connect_timeout(), request_timeout);
  auto* h = static_cast<CURL*>(take_handle());
  // Back to the pool however this attempt ends, with its connections kept.
  struct Return {
    EtcdClient* self;
    CURL* h;
    curl_slist* headers = nullptr;
    ~Return() {
      curl_slist_free_all(headers);
      self->give_handle(h);
    }
  } back{this, h};
  curl_easy_reset(h);
  const auto url = urls_[member] + path;
  std::string reply;
  char error[CURL_ERROR_SIZE] = {0};
  back.headers = curl_slist_append(back.headers, "Content-Type: application/json");
  if (!token.empty()) back.headers = curl_slist_append(back.headers, ("Authorization: " + token).c_str());
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, back.headers);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append_reply);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
  // Threads and timeouts: curl must not use signals (SIGALRM) for its timeouts.
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(request_timeout.count()));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_timeout.count()));
  // The members are reached directly: an http_proxy meant for the web must not
  // carry the job's store.
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  const auto& c = options_.certificates();
  if (!c.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, c.ca_file.c_str());
  if (!c.cert_file.empty()) curl_easy_setopt(h, CURLOPT_SSLCERT, c.cert_file.c_str());
  if (!c.key_file.empty()) curl_easy_setopt(h, CURLOPT_SSLKEY, c.key_file.c_str());

  const CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    a.tls = rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CERTPROBLEM ||
            rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_SSL_ISSUER_ERROR || rc == CURLE_SSL_CIPHER ||
            // TLS 1.3: a member that refuses this client's certificate says so
            // with an alert after the handshake, on the first read.
            ((rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR) && contains(error, "SSL") && contains(error, "alert"));
    a.why = rc == CURLE_OPERATION_TIMEDOUT
                ? fmt::format("no reply within {:.1f} s", seconds(request_timeout))
                : std::string(error[0] ? error : curl_easy_strerror(rc));
    return a;
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  a.reply = nlohmann::json::parse(reply, nullptr, false);
  if (a.reply.is_discarded() || !a.reply.is_object()) {
    a.why = fmt::format("HTTP {} with a reply that is not etcd's JSON: '{}'", status, reply.substr(0, 120));
    return a;
  }
  const auto code = a.reply.find("code");
  if (status == 200 && code == a.reply.end() && !a.reply.contains("error")) {
    a.kind = Attempt::Kind::kOk;
    return a;
  }
  a.code = code != a.reply.end() && code->is_number_integer() ? code->get<int>() : 0;
  auto message = a.reply.value("message", a.reply.value("error", std::string("no message")));
  a.why = fmt::format("{} (HTTP {}, code {})", message, status, a.code);
  if (a.code == kUnauthenticated && contains(message, "invalid auth token"))
    a.kind = Attempt::Kind::kUnauthenticated;
  else if (a.code == kInvalidArgument || a.code == kPermissionDenied || a.code == kResourceExhausted ||
           a.code == kFailedPrecondition || a.code == kUnauthenticated || status == 400 || status == 401 ||
           status == 403 || status == 404 || status == 413)
    a.kind = Attempt::Kind::kRefused;
  // Anything else (no leader, leader changed, request timed out, an HTTP 5xx from
  // a proxy) is a member that cannot serve the request now.
  return a;
}

std::string EtcdClient::token(const std::string& stale, const std::string& what, Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(token_mutex_);
  if (options_.user().empty() || auth_disabled_) return "";
  if (!token_.empty() && token_ != stale) return token_;
  token_.clear();
  const auto body =
      nlohmann::json{{"name", options_.user()}, {"password", options_.password()}}.dump();
  std::vector<Said> said(urls_.size());
  const auto start = Clock::now();
  auto backoff = milliseconds(50);
  while (true) {
    const auto first = preferred_.load();
    for (std::size_t i = 0; i < urls_.size(); ++i) {
      const auto m = (first + i) % urls_.size();
      auto a = attempt(m, "/v3/auth/authenticate", body, "", deadline);
      if (a.kind == Attempt::Kind::kOk) {
        preferred_ = m;
        token_ = a.reply.value("token", "");
        return token_;
      }
      if (a.kind != Attempt::Kind::kUnavailable) {
        if (contains(a.why, "authentication is not enabled")) {
          auth_disabled_ = true;
          return "";
        }
        throw ConfigError(fmt::format(
            "cohort: etcd auth refused user '{}' at {} (needed for {}): {}\n  fix: check the etcd user and "
            "password given to cohort (etcdctl user get {} shows the user)",
            options_.user(), options_.endpoints()[m], what, a.why, options_.user()));
      }
      if (a.tls || !said[m].tls) said[m] = {a.why, a.tls};  // a TLS failure is the one to show
    }
    // Note [TLS failures are the configuration's]: no point in going round again.
    if (std::all_of(said.begin(), said.end(), [](const Said& x) { return x.tls; })) break;
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  fail_all(fmt::format("authentication of user '{}' (for {})", options_.user(), what), said, start);
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
  auto backoff = milliseconds(50);
  while (true) {
    const auto first = preferred_.load();
    for (std::size_t i = 0; i < urls_.size(); ++i) {
      const auto m = (first + i) % urls_.size();
      auto a = attempt(m, path, body, token, deadline);
      switch (a.kind) {
        case Attempt::Kind::kOk:
          preferred_ = m;
          return std::move(a.reply);
        case Attempt::Kind::kUnavailable:
          if (a.tls || !said[m].tls) said[m] = {a.why, a.tls};  // a TLS failure is the one to show
          continue;
        case Attempt::Kind::kUnauthenticated:
          // Tokens expire (etcd's --auth-token-ttl, 5 min) or die with the member
          // that issued them: authenticate again and retry this member.
          if (++authentications > 3)
            throw ConfigError(fmt::format("cohort: etcd at {} keeps refusing the auth token of user '{}' for {}: {}",
                                          options_.endpoints()[m], options_.user(), what, a.why));
          token = this->token(token, what, deadline);
          --i;
          continue;
        case Attempt::Kind::kRefused: break;
      }
      const auto& at = options_.endpoints()[m];
      if (contains(a.why, "user name is empty") || a.code == kUnauthenticated)
        throw ConfigError(fmt::format("cohort: etcd at {} requires authentication (etcd auth is enabled) and "
                                      "refused {}: {}\n  fix: pass the etcd user and password",
                                      at, what, a.why));
      if (a.code == kPermissionDenied)
        throw ConfigError(fmt::format(
            "cohort: etcd user '{}' may not make the {} at {}: {}\n  fix: grant the user's role readwrite on the "
            "prefix (etcdctl role grant-permission ROLE --prefix=true readwrite '{}')",
            options_.user(), what, at, a.why, options_.prefix()));
      if (a.code == kResourceExhausted || contains(a.why, "too large"))
        throw ConfigError(fmt::format("cohort: etcd at {} refused the {} as too large: {}\n  fix: keep values "
                                      "small, or raise the members' --max-request-bytes (1.5 MiB by default)",
                                      at, what, a.why));
      throw CommError(fmt::format("cohort: etcd at {} refused the {}: {}", at, what, a.why));
    }
    // Note [TLS failures are the configuration's]: no point in going round again.
    if (std::all_of(said.begin(), said.end(), [](const Said& x) { return x.tls; })) break;
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  fail_all(what, said, start);
}

}  // namespace cohort::store
