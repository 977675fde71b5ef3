#include "cohort/store/etcd_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <thread>
#include <unordered_map>

#include "cohort/errors.h"
#include "cohort/store/base64.h"
#include "cohort/store/etcd_client_internal.h"
#include "cohort/store/etcd_kv_internal.h"

namespace cohort::store {
namespace {

using Bytes = std::vector<std::uint8_t>;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

double seconds(milliseconds t) { return std::chrono::duration<double>(t).count(); }

std::string quoted(const std::vector<std::string>& keys) {
  std::vector<std::string> shown;
  for (std::size_t i = 0; i < keys.size() && i < 8; ++i) shown.push_back("'" + keys[i] + "'");
  auto out = fmt::format("{}", fmt::join(shown, ", "));
  if (keys.size() > shown.size()) out += fmt::format(" and {} more", keys.size() - shown.size());
  return out;
}

// Note [Waiting by polling]
// get, wait and multiGet read their keys again until they exist, 1 ms after the
// first try and then twice as long each time up to 50 ms, rather than holding an
// etcd watch: the gateway streams a watch as one long HTTP reply, which would
// need a thread or a multi handle per waiter and its own failover, while a read is
// one bounded request like every other and fails over the same way. At a job's
// scale (a few waiting threads per process, keys written once) the reads cost
// etcd little, and a key written while a waiter sleeps is seen within 50 ms.
//
// Calls `done` until it holds or `timeout` has passed, with those pauses between
// calls; returns whether it held.
bool poll(milliseconds timeout, const std::function<bool()>& done) {
  const auto deadline = Clock::now() + timeout;
  auto pause = milliseconds(1);
  while (!done()) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, milliseconds(50));
  }
  return true;
}

}  // namespace

EtcdStore::EtcdStore(EtcdStoreOptions options)
    : c10d::Store(options.timeout()), client_(std::make_unique<EtcdClient>(std::move(options))) {}

EtcdStore::~EtcdStore() = default;

const EtcdStoreOptions& EtcdStore::options() const { return client_->options(); }

milliseconds EtcdStore::timeout() const {
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  return timeout_;
}

void EtcdStore::setTimeout(const milliseconds& timeout) {
  if (timeout.count() <= 0)
    throw ConfigError("cohort: a store timeout must be > 0 (cohort bounds every wait; c10d reads 0 as forever)");
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  timeout_ = timeout;
}

void EtcdStore::throw_timeout(const char* what, const std::vector<std::string>& keys, milliseconds timeout) const {
  throw TimeoutError(
      fmt::format("cohort: store {} timed out after {:.1f} s waiting for key{} {} under prefix '{}' in etcd {}\n  "
                  "fix: check that whoever sets {} (a rank, or the agent) is running and uses the same prefix; "
                  "raise the store timeout if it starts slowly",
                  what, seconds(timeout), keys.size() == 1 ? "" : "s", quoted(keys), options().prefix(),
                  client_->members(), keys.size() == 1 ? "it" : "them"),
      std::string("store ") + what, {});
}

void EtcdStore::set(const std::string& key, const Bytes& value) {
  client_->call("/v3/kv/put", {{"key", key64(*client_, key)}, {"value", base64_encode(value)}},
                fmt::format("set of '{}'", key));
}

Bytes EtcdStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  // c10d's rule (as store/table.cpp): an absent key counts as holding the empty
  // value, but a failed swap on an absent key answers with the expected value.
  auto [after, written] = read_modify_write(
      *client_, key, fmt::format("compareSet of '{}'", key), timeout(),
      [&](const std::optional<Bytes>& current) -> std::optional<Bytes> {
        if ((!current && expected.empty()) || (current && *current == expected)) return desired;
        return std::nullopt;
      });
  (void)written;
  return after ? *after : expected;
}

Bytes EtcdStore::get(const std::string& key) {
  const auto t = timeout();
  const auto what = fmt::format("get of '{}'", key);
  std::optional<Bytes> value;
  if (!poll(t, [&] { return (value = std::move(fetch(*client_, {key}, true, what)[0])).has_value(); }))
    throw_timeout("get", {key}, t);
  return std::move(*value);
}

std::int64_t EtcdStore::add(const std::string& key, std::int64_t value) {
  std::int64_t result = 0;
  read_modify_write(*client_, key, fmt::format("add to '{}'", key), timeout(),
                    [&](const std::optional<Bytes>& current) -> std::optional<Bytes> {
                      std::int64_t n = 0;
                      if (current) {
                        // c10d keeps counters as decimal text and parses them with std::stoll.
                        try {
                          n = std::stoll(std::string(current->begin(), current->end()));
                        } catch (const std::exception&) {
                          TORCH_CHECK(false, "cohort: store key '", key, "' holds a value that is not an integer, ",
                                      "so add cannot count on it; use a key of its own for the counter");
                        }
                      }
                      TORCH_CHECK(!__builtin_add_overflow(n, value, &result), "cohort: add of ", value,
                                  " to store key '", key, "' overflows a 64-bit integer; the counter is left as it was");
                      auto text = std::to_string(result);
                      return Bytes(text.begin(), text.end());
                    });
  return result;
}

bool EtcdStore::deleteKey(const std::string& key) {
  auto reply = client_->call("/v3/kv/deleterange", {{"key", key64(*client_, key)}},
                             fmt::format("deleteKey of '{}'", key));
  return number(reply, "deleted") > 0;
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  const auto found = fetch(*client_, keys, false, fmt::format("check of {}", quoted(keys)));
  return std::all_of(found.begin(), found.end(), [](const auto& f) { return f.has_value(); });
}

std::int64_t EtcdStore::getNumKeys() {
  const auto& prefix = options().prefix();
  auto reply = client_->call(
      "/v3/kv/range",
      {{"key", base64_encode(prefix)}, {"range_end", base64_encode(prefix_end(prefix))}, {"count_only", true}},
      fmt::format("getNumKeys under '{}'", prefix));
  return number(reply, "count");
}

void EtcdStore::wait_for(const std::vector<std::string>& keys, milliseconds timeout, const char* what) {
  if (timeout.count() <= 0)
    throw ConfigError("cohort: a store wait needs a timeout > 0 (cohort bounds every wait; c10d reads 0 as forever)");
  std::vector<std::string> missing = keys;
  const auto call = fmt::format("{} for {}", what, quoted(keys));
  const bool done = poll(timeout, [&] {
    const auto found = fetch(*client_, missing, false, call);
    std::vector<std::string> still;
    for (std::size_t i = 0; i < missing.size(); ++i)
      if (!found[i]) still.push_back(missing[i]);
    missing = std::move(still);
    return missing.empty();
  });
  if (!done) throw_timeout(what, missing, timeout);
}

void EtcdStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

void EtcdStore::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  wait_for(keys, timeout, "wait");
}

#if COHORT_C10D_STORE_HAS_EXTENDED_API
void EtcdStore::append(const std::string& key, const Bytes& value) {
  read_modify_write(*client_, key, fmt::format("append to '{}'", key), timeout(),
                    [&](const std::optional<Bytes>& current) -> std::optional<Bytes> {
                      Bytes next = current.value_or(Bytes{});
                      next.insert(next.end(), value.begin(), value.end());
                      return next;
                    });
}

std::vector<Bytes> EtcdStore::multiGet(const std::vector<std::string>& keys) {
  const auto t = timeout();
  wait_for(keys, t, "multiGet");
  // The keys exist now; one whose value is gone by the next read (deleted between
  // the two) fails the get, as TCPStore's would wait on it.
  auto found = fetch(*client_, keys, true, fmt::format("multiGet of {}", quoted(keys)));
  std::vector<Bytes> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!found[i]) throw_timeout("multiGet", {keys[i]}, t);
    out.push_back(std::move(*found[i]));
  }
  return out;
}

void EtcdStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  TORCH_CHECK(keys.size() == values.size(), "cohort: store multiSet got ", keys.size(), " keys but ", values.size(),
              " values");
  // etcd refuses a transaction that puts one key twice; a key given twice ends with
  // its last value, as in TCPStore.
  std::unordered_map<std::string, std::size_t> last;
  for (std::size_t i = 0; i < keys.size(); ++i) last[keys[i]] = i;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (last[keys[i]] == i) order.push_back(i);
  // One transaction per kMaxTxnOps keys: all of them or none is written.
  for (std::size_t start = 0; start < order.size(); start += kMaxTxnOps) {
    json ops = json::array();
    for (std::size_t j = start; j < std::min(order.size(), start + kMaxTxnOps); ++j)
      ops.push_back(put_op(key64(*client_, keys[order[j]]), values[order[j]]));
    client_->call("/v3/kv/txn", {{"success", ops}}, fmt::format("multiSet of {}", quoted(keys)));
  }
}
#endif

c10::intrusive_ptr<c10d::Store> make_etcd_store(const EtcdStoreOptions& options) {
  return c10::make_intrusive<EtcdStore>(options);
}

std::int64_t delete_etcd_prefix(const EtcdStoreOptions& options) {
  EtcdClient client(options);
  const auto& prefix = options.prefix();
  auto reply = client.call("/v3/kv/deleterange",
                           {{"key", base64_encode(prefix)}, {"range_end", base64_encode(prefix_end(prefix))}},
                           fmt::format("delete of every key under '{}'", prefix));
  return number(reply, "deleted");
}

bool delete_etcd_prefix_if(const EtcdStoreOptions& options, const std::string& key, const Bytes& value) {
  EtcdClient client(options);
  const auto& prefix = options.prefix();
  const nlohmann::json txn = {
      {"compare", nlohmann::json::array({{{"key", key64(client, key)},
                                          {"target", "VALUE"},
                                          {"result", "EQUAL"},
                                          {"value", base64_encode(value)}}})},
      {"success", nlohmann::json::array({{{"request_delete_range",
                                           {{"key", base64_encode(prefix)},
                                            {"range_end", base64_encode(prefix_end(prefix))}}}}})}};
  return client.call("/v3/kv/txn", txn, fmt::format("conditional delete of every key under '{}'", prefix))
      .value("succeeded", false);
}

c10::intrusive_ptr<c10d::Store> EtcdStore::clone() {
  return c10::make_intrusive<EtcdStore>(EtcdStoreOptions(options()).timeout(timeout()));
}

}  // namespace cohort::store
