#include "cohort/store/etcd_kv_internal.h"

#include <fmt/format.h>

#include <algorithm>

#include "cohort/errors.h"
#include "cohort/store/base64.h"
#include "cohort/store/etcd_client_internal.h"

namespace cohort::store {
namespace {

using Bytes = std::vector<std::uint8_t>;
using Clock = std::chrono::steady_clock;

double seconds(std::chrono::milliseconds t) { return std::chrono::duration<double>(t).count(); }

}  // namespace

using nlohmann::json;

std::int64_t number(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return 0;
}

std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

json put_op(const std::string& key64, const Bytes& value) {
  return {{"request_put", {{"key", key64}, {"value", base64_encode(value)}}}};
}

Bytes value_of(const json& kv) {
  auto text = kv.value("value", std::string());
  auto bytes = base64_decode(text);
  if (!bytes) throw CommError("cohort: etcd sent a value that is not base64; is this endpoint etcd?");
  return std::move(*bytes);
}

std::string key64(const EtcdClient& client, const std::string& key) {
  return base64_encode(client.options().prefix() + key);
}

std::vector<std::optional<Bytes>> fetch(EtcdClient& client, const std::vector<std::string>& keys, bool values,
                                        const std::string& what) {
  std::vector<std::optional<Bytes>> out;
  for (std::size_t start = 0; start < keys.size(); start += kMaxTxnOps) {
    const auto end = std::min(keys.size(), start + kMaxTxnOps);
    json ops = json::array();
    for (std::size_t i = start; i < end; ++i) {
      json range = {{"key", key64(client, keys[i])}};
      if (!values) range["count_only"] = true;
      ops.push_back({{"request_range", range}});
    }
    auto reply = client.call("/v3/kv/txn", {{"success", ops}}, what);
    const auto responses = reply.value("responses", json::array());
    if (responses.size() != end - start)
      throw CommError(fmt::format("cohort: etcd answered the {} with {} results for {} keys", what,
                                  responses.size(), end - start));
    for (const auto& r : responses) {
      const auto range = r.value("response_range", json::object());
      if (number(range, "count") == 0) {
        out.emplace_back();
      } else {
        const auto kvs = range.value("kvs", json::array());
        out.emplace_back(values && !kvs.empty() ? value_of(kvs[0]) : Bytes{});
      }
    }
  }
  return out;
}

std::pair<std::optional<Bytes>, bool> read_modify_write(
    EtcdClient& client, const std::string& key, const std::string& what, std::chrono::milliseconds bound,
    const std::function<std::optional<Bytes>(const std::optional<Bytes>&)>& decide) {
  const auto k = key64(client, key);
  auto reply = client.call("/v3/kv/range", {{"key", k}}, what);
  auto kvs = reply.value("kvs", json::array());
  const auto deadline = Clock::now() + bound;
  for (int tries = 1;; ++tries) {
    std::optional<Bytes> current;
    std::int64_t revision = 0;
    if (!kvs.empty()) {
      current = value_of(kvs[0]);
      revision = number(kvs[0], "mod_revision");
    }
    auto next = decide(current);
    if (!next) return {current, false};
    json txn = {{"compare", json::array({{{"key", k}, {"target", "MOD"}, {"result", "EQUAL"},
                                          {"mod_revision", std::to_string(revision)}}})},
                {"success", json::array({put_op(k, *next)})},
                {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
    reply = client.call("/v3/kv/txn", txn, what);
    if (reply.value("succeeded", false)) return {std::move(next), true};
    if (Clock::now() >= deadline)
      throw CommError(fmt::format("cohort: etcd: the {} lost the race to other writers {} times in {:.1f} s",
                                  what, tries, seconds(bound)));
    const auto responses = reply.value("responses", json::array());
    kvs = responses.empty() ? json::array()
                            : responses[0].value("response_range", json::object()).value("kvs", json::array());
  }
}

}  // namespace cohort::store
