#pragma once
// The HTTP/JSON layer under EtcdStore: POSTs a request of etcd's v3 API (its JSON
// gRPC gateway: /v3/kv/range, /v3/kv/txn, ...) to one member of the cluster and
// returns the decoded reply, going on to the next member when one cannot serve it.
// Internal: not installed; EtcdStore is the interface.
//
//   EtcdClient client(options);
//   auto reply = client.call("/v3/kv/range", {{"key", base64_encode("k")}}, "get of 'k'");
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "cohort/store/etcd_options.h"

namespace cohort::store {

// Note [Members in turn]
// Every member of an etcd cluster serves every request, forwarding writes to the
// leader, so the client needs only one that works. A call starts with the member
// that answered last and goes on to the next one when a member cannot serve it:
// no connection (refused, or none within connect_timeout), no reply within
// request_timeout, or an answer that it cannot serve now (no leader, leader
// changed, request timed out: codes Unavailable, DeadlineExceeded, Aborted). After
// a whole round without an answer it waits (50 ms, doubling to 1 s) and goes round
// again, until failover_timeout has passed since the call began: an election after
// the leader's loss takes about a second and is ridden through. When the
// cluster has lost its quorum no member can commit anything, and the call ends
// with a CommError that names etcd, every member tried and what each said. A
// write whose reply was lost may have been applied; it is sent again to the next
// member, which is harmless for put and delete (Note [Read-modify-write in etcd]
// says what it means for add).
class EtcdClient {
 public:
  // Throws ConfigError when the options cannot work (validate in etcd_options.h).
  explicit EtcdClient(EtcdStoreOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The reply to `body` POSTed to `path`. `what` says what the call is for in
  // errors ("put of 'key'"). Throws CommError when no member answers within
  // failover_timeout (Note [Members in turn]), ConfigError when etcd refuses the
  // credentials or the request itself (too large, permission denied).
  nlohmann::json call(const std::string& path, const nlohmann::json& body, const std::string& what);

  const EtcdStoreOptions& options() const { return options_; }
  // The endpoints as given, for messages: "[a:2379, b:2379]".
  std::string members() const;

 private:
  struct Attempt;
  struct Said {
    std::string why = "not tried before the deadline";
    bool tls = false;
  };
  Attempt attempt(std::size_t member, const std::string& path, const std::string& body, const std::string& token,
                  std::chrono::steady_clock::time_point deadline);
  // The token to send; authenticates first when a user is set and none is held, or
  // when `stale` is the token etcd just refused.
  std::string token(const std::string& stale, const std::string& what, std::chrono::steady_clock::time_point deadline);
  // What one member's try came to, for in_turn().
  enum class Turn { kServed, kNext, kAgain };
  // Note [Members in turn]: tries `visit` on each member, starting with the one
  // that served last, round after round with a growing pause, until a member is
  // kServed (it becomes the preferred one; returns true), `deadline` passes, or
  // every member failed at TLS (returns false). kAgain tries the same member again.
  // `visit` keeps what each member said in `said`.
  bool in_turn(std::chrono::steady_clock::time_point deadline, const std::vector<Said>& said,
               const std::function<Turn(std::size_t member)>& visit);
  // Throws the error for a call that no member served: CommError naming etcd, the
  // members and what each said, or ConfigError when each failed at TLS.
  [[noreturn]] void fail_all(const std::string& what, const std::vector<Said>& said,
                             std::chrono::steady_clock::time_point start) const;
  void* take_handle();
  void give_handle(void* handle);

  EtcdStoreOptions options_;
  std::vector<std::string> urls_;  // endpoints_ with their scheme
  std::atomic<std::size_t> preferred_{0};
  std::mutex token_mutex_;
  std::string token_;
  bool auth_disabled_ = false;  // a user was given, but the cluster has no auth enabled
  std::mutex handles_mutex_;
  std::vector<void*> idle_handles_;  // curl easy handles, each keeping its connections
};

}  // namespace cohort::store
