#pragma once
// Key-value steps of etcd's v3 API that EtcdStore (store/etcd_store.h) is made of:
// keys under the store's prefix, reads of many keys in one transaction, and the
// read-modify-write that add, append and compareSet need. Internal: not installed.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort::store {

class EtcdClient;

// etcd's default --max-txn-ops: a transaction holds at most this many operations.
inline constexpr std::size_t kMaxTxnOps = 128;

// etcd's int64 fields arrive as JSON strings, and are left out when zero.
std::int64_t number(const nlohmann::json& j, const char* field);
// The range end that makes a range request cover every key starting with `prefix`.
std::string prefix_end(std::string prefix);
// `key` under the client's prefix, base64 as etcd's JSON wants it.
std::string key64(const EtcdClient& client, const std::string& key);
// A transaction's operation that puts `value` under the (base64) key.
nlohmann::json put_op(const std::string& key64, const std::vector<std::uint8_t>& value);
// The value of one of etcd's key-value records; an empty value is left out.
std::vector<std::uint8_t> value_of(const nlohmann::json& kv);

// The keys' records, nullopt for those that do not exist; `values` false asks only
// whether they exist (the records then hold no value). One transaction per
// kMaxTxnOps keys, each a consistent snapshot.
std::vector<std::optional<std::vector<std::uint8_t>>> fetch(EtcdClient& client, const std::vector<std::string>& keys,
                                                            bool values, const std::string& what);

// Note [Read-modify-write in etcd]
// etcd has no add, append or compare-and-swap of c10d's kind, so these read the
// key, work out its new value, and write it in a transaction whose compare is the
// key's mod_revision as read (0: the key does not exist). When another writer got
// there first the compare fails, the transaction's failure branch returns the key
// as it is now, and the step is tried again on that: so each add is applied once,
// atomically, however many threads and hosts add to one counter. One exception is
// etcd's and any client's: a transaction that was committed but whose answer never
// came (the member died before answering, or answered after request_timeout) is
// sent again to the next member and applied again, so a counter may then gain one
// add more. Keep request_timeout well above the cluster's commit time.

// Applies `decide` to the key's value (nullopt: no such key) until its answer is
// written unchanged-since-read; returns the value after and whether it was written.
// `decide` returning nullopt writes nothing. Gives up with CommError when other
// writers keep winning for longer than `bound`.
std::pair<std::optional<std::vector<std::uint8_t>>, bool> read_modify_write(
    EtcdClient& client, const std::string& key, const std::string& what, std::chrono::milliseconds bound,
    const std::function<std::optional<std::vector<std::uint8_t>>(const std::optional<std::vector<std::uint8_t>>&)>&
        decide);

}  // namespace cohort::store
