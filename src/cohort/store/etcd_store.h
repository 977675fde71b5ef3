#pragma once
// A c10d::Store kept in an etcd cluster (its v3 API), for jobs that must outlive the
// loss of any one host: etcd replicates every key on a majority of its members, so
// the store goes on while a majority is up (docs/etcd.md). Usable wherever c10d
// wants a store: Gloo and NCCL bootstrap, PrefixStore, cohort's rendezvous.
//
//   auto store = c10::make_intrusive<cohort::store::EtcdStore>(
//       cohort::store::EtcdStoreOptions({"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"})
//           .prefix("cohort/" + run_id + "/"));
//   store->set("key", cohort::util::to_bytes("value"));
//
// Its semantics are TCPStore's, as StoreClient's (store/store_client.h) are;
// errors are cohort's: TimeoutError when a wait runs out (naming the keys),
// CommError when no member of the cluster can serve a request (its quorum lost),
// ConfigError for bad options and refused credentials. Thread-safe: each request is
// an HTTP request of its own, so a thread blocked in get() delays no other.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cohort/compat/c10d.h"
#include "cohort/store/etcd_options.h"

namespace cohort::store {

class EtcdClient;

class EtcdStore : public c10d::Store {
 public:
  // Checks the options (ConfigError) but does not reach etcd yet: the first
  // operation does, and its error says why it could not.
  explicit EtcdStore(EtcdStoreOptions options);
  ~EtcdStore() override;
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

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
  // The keys under this store's prefix.
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

  // Another store over the same cluster and prefix, with this one's timeout. LibTorch
  // after 2.6 made this a pure virtual of c10d::Store: declared without `override`,
  // it overrides it there and is a plain member before, so no version test is needed.
  virtual c10::intrusive_ptr<c10d::Store> clone();  // NOLINT(modernize-use-override)

  const EtcdStoreOptions& options() const;

 private:
  // Polls until every key exists or `timeout` runs out (TimeoutError naming `what`).
  void wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, const char* what);
  [[noreturn]] void throw_timeout(const char* what, const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout) const;
  std::chrono::milliseconds timeout() const;

  std::unique_ptr<EtcdClient> client_;
  mutable std::mutex timeout_mutex_;
};

}  // namespace cohort::store
