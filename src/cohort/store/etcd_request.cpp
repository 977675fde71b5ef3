#include "cohort/store/etcd_request_internal.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>

#include "cohort/errors.h"

namespace cohort::store {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// No reply of etcd's comes near this; a member sending more is not etcd.
constexpr std::size_t kMaxReplyBytes = std::size_t{512} << 20;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::size_t append_reply(char* data, std::size_t size, std::size_t count, void* out) {
  auto& reply = *static_cast<std::string*>(out);
  if (reply.size() + size * count > kMaxReplyBytes) return 0;  // curl then fails the transfer
  reply.append(data, size * count);
  return size * count;
}

}  // namespace

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
            ((rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR) && mentions(error, "SSL") && mentions(error, "alert"));
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
  if (a.code == kUnauthenticated && mentions(message, "invalid auth token"))
    a.kind = Attempt::Kind::kUnauthenticated;
  else if (a.code == kInvalidArgument || a.code == kPermissionDenied || a.code == kResourceExhausted ||
           a.code == kFailedPrecondition || a.code == kUnauthenticated || status == 400 || status == 401 ||
           status == 403 || status == 404 || status == 413)
    a.kind = Attempt::Kind::kRefused;
  // Anything else (no leader, leader changed, request timed out, an HTTP 5xx from
  // a proxy) is a member that cannot serve the request now.
  return a;
}

}  // namespace cohort::store
