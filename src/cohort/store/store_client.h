#pragma once
// A client of cohort's authenticated store (store/store_server.h), usable wherever
// c10d wants a c10d::Store: Gloo and NCCL backends, PrefixStore, cohort's own join.
//
//   auto store = c10::make_intrusive<cohort::store::StoreClient>(host, port, token, std::chrono::seconds(60));
//   store->set("key", cohort::util::to_bytes("value"));
//
// Its semantics are TCPStore's; errors are cohort's: TimeoutError when a wait runs
// out (naming the keys), CommError when the server goes away, ConfigError when it
// holds another token. One connection per client, shared by threads: requests are
// serialised, so a thread blocked in get() delays the others; give a thread that
// must not wait (a heartbeat) a client of its own. After a CommError, or a
// TimeoutError from a server that stopped answering, the client stays broken and
// every later call throws CommError; make a new one to reconnect.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cohort/compat/c10d.h"
#include "cohort/store/certificates.h"

namespace cohort::store {

struct ClientSession;
struct Request;
struct Reply;

class StoreClient : public c10d::Store {
 public:
  // Connects and authenticates within `timeout`, retrying while nobody listens
  // (the server may start later); `timeout` also becomes getTimeout(). Throws
  // TimeoutError when no store answers in time, ConfigError when the server holds
  // another token (or `timeout` is not > 0), CommError when the server fails to
  // prove it holds the token. With `certificates` (the site's CA, this peer's
  // certificate and key), the connection is mutual TLS under them as well (Note
  // [Certificates and the token] in store/certificates.h).
  StoreClient(std::string host, int port, std::string token, std::chrono::milliseconds timeout,
              Certificates certificates = {});
  ~StoreClient() override;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // 2.x's std::string overloads stay visible next to the overrides below.
  using c10d::Store::compareSet;
  using c10d::Store::set;

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;
  std::vector<std::uint8_t> compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                       const std::vector<std::uint8_t>& desired) override;
  // Waits up to getTimeout() for the key to exist.
  std::vector<std::uint8_t> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  std::int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // c10d reads a zero timeout as "wait forever"; cohort bounds every wait, so a
  // timeout that is not > 0 throws ConfigError.
  void setTimeout(const std::chrono::milliseconds& timeout) override;

#if COHORT_C10D_STORE_HAS_EXTENDED_API
  void append(const std::string& key, const std::vector<std::uint8_t>& value) override;
  // Waits up to getTimeout() for every key to exist.
  std::vector<std::vector<std::uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<std::uint8_t>>& values) override;
  bool hasExtendedApi() const override { return true; }
#endif

  // A new connection to the same store, with this client's timeout. LibTorch after
  // 2.6 made this a pure virtual of c10d::Store: declared without `override`, it
  // overrides it there and is a plain member before, so no version test is needed.
  virtual c10::intrusive_ptr<c10d::Store> clone();  // NOLINT(modernize-use-override)

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  Reply call(const Request& request, std::chrono::milliseconds server_wait);
  [[noreturn]] void fail(const std::string& why, bool timed_out);
  [[noreturn]] void throw_timeout(const char* what, const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout) const;
  std::chrono::milliseconds timeout() const;

  std::string host_;
  int port_;
  std::string token_;  // kept for clone()
  Certificates certificates_;
  mutable std::mutex timeout_mutex_;
  std::mutex mutex_;  // one request at a time on the connection
  std::unique_ptr<ClientSession> session_;
  std::string broken_;  // why the connection is unusable; empty while it works
};

}  // namespace cohort::store
