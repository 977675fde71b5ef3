#include "cohort/store/table.h"

#include <stdexcept>

#include <fmt/format.h>

namespace cohort::store {
namespace {

Reply ok(std::int64_t number = 0, std::vector<Bytes> values = {}) {
  Reply r;
  r.number = number;
  r.values = std::move(values);
  return r;
}

Reply error(const std::string& message) {
  Reply r;
  r.status = Status::kError;
  r.values.emplace_back(message.begin(), message.end());
  return r;
}

Bytes to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A key as a message shows it: quoted, and cut short when long (a key may be
// megabytes, and the message goes back over the wire).
std::string shown(const std::string& key) {
  constexpr std::size_t kShown = 80;
  if (key.size() <= kShown) return "'" + key + "'";
  return fmt::format("'{}...' ({} bytes)", key.substr(0, kShown), key.size());
}

std::string shown(const std::vector<std::string>& keys) {
  if (keys.empty()) return "no keys";
  if (keys.size() == 1) return "key " + shown(keys[0]);
  auto out = "keys " + shown(keys.at(0));
  if (keys.size() > 1) out += fmt::format(" and {} more", keys.size() - 1);
  return out;
}

}  // namespace

std::vector<std::string> Table::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (map_.count(k) == 0) out.push_back(k);
  return out;
}

std::size_t Table::cost(const std::string& key, std::size_t value_size) const {
  return key.size() + value_size + options_.entry_overhead_bytes();
}

std::int64_t Table::growth(const std::string& key, std::size_t value_size) const {
  auto grow = static_cast<std::int64_t>(cost(key, value_size));
  auto it = map_.find(key);
  if (it != map_.end()) grow -= static_cast<std::int64_t>(cost(key, it->second.size()));
  return grow;
}

std::optional<Reply> Table::over_value_cap(Op op, const std::string& key, std::size_t value_size) const {
  if (value_size <= options_.max_value_bytes()) return std::nullopt;
  return error(fmt::format("cohort: store {} refused: the value of key {} would be {} bytes, over the store's "
                           "limit of {} bytes per value (StoreServerOptions::max_value_bytes); nothing was "
                           "written; store smaller values, or split them over several keys",
                           op_name(op), shown(key), value_size, options_.max_value_bytes()));
}

std::optional<Reply> Table::over_table_cap(Op op, const std::vector<std::string>& keys, std::int64_t grow) const {
  // bytes_ never exceeds the cap, so a write that does not grow the table passes.
  if (grow <= 0) return std::nullopt;
  const auto after = bytes_ + static_cast<std::uint64_t>(grow);
  if (after <= options_.max_table_bytes()) return std::nullopt;
  return error(fmt::format("cohort: store {} of {} refused: the store would hold {} bytes, over its limit of {} "
                           "bytes in all (StoreServerOptions::max_table_bytes); nothing was written; delete keys "
                           "you no longer need",
                           op_name(op), shown(keys), after, options_.max_table_bytes()));
}

void Table::put(const std::string& key, Bytes value) {
  bytes_ = static_cast<std::uint64_t>(static_cast<std::int64_t>(bytes_) + growth(key, value.size()));
  map_[key] = std::move(value);
}

std::optional<Reply> Table::apply(const Request& request) {
  const auto& keys = request.keys;
  const auto& values = request.values;
  switch (request.op) {
    case Op::kSet:
      if (auto refused = over_value_cap(request.op, keys[0], values[0].size())) return refused;
      if (auto refused = over_table_cap(request.op, keys, growth(keys[0], values[0].size()))) return refused;
      put(keys[0], values[0]);
      ++generation_;
      return ok();
    case Op::kGet: {
      auto it = map_.find(keys[0]);
      if (it == map_.end()) return std::nullopt;
      return ok(0, {it->second});
    }
    case Op::kCompareSet: {
      // c10d's rule: an absent key counts as holding the empty value, but a failed
      // swap on an absent key answers with the expected value, not an empty one.
      // Only a swap writes, so only a swap is held to the caps.
      const Bytes& expected = values[0];
      auto it = map_.find(keys[0]);
      if ((it == map_.end() && expected.empty()) || (it != map_.end() && it->second == expected)) {
        if (auto refused = over_value_cap(request.op, keys[0], values[1].size())) return refused;
        if (auto refused = over_table_cap(request.op, keys, growth(keys[0], values[1].size()))) return refused;
        put(keys[0], values[1]);
        ++generation_;
        return ok(0, {values[1]});
      }
      return ok(0, {it == map_.end() ? expected : it->second});
    }
    case Op::kAdd: {
      std::int64_t current = 0;
      auto it = map_.find(keys[0]);
      if (it != map_.end()) {
        // c10d stores counters as decimal text and parses them with std::stoll.
        try {
          current = std::stoll(std::string(it->second.begin(), it->second.end()));
        } catch (const std::exception&) {
          return error("cohort: store key " + shown(keys[0]) + " holds a value that is not an integer, so ADD "
                       "cannot count on it; use a key of its own for the counter");
        }
      }
      // A peer's delta is any int64; overflowing would be undefined behaviour in the
      // server (found by fuzz_store_wire), so it is this request's error instead.
      if (__builtin_add_overflow(current, request.number, &current)) {
        return error("cohort: ADD of " + std::to_string(request.number) + " to store key " + shown(keys[0]) +
                     " overflows a 64-bit integer; the counter is left as it was");
      }
      // The counter's text changes length (9 -> 10, or a new key), so it counts too.
      auto text = to_bytes(std::to_string(current));
      if (auto refused = over_value_cap(request.op, keys[0], text.size())) return refused;
      if (auto refused = over_table_cap(request.op, keys, growth(keys[0], text.size()))) return refused;
      put(keys[0], std::move(text));
      ++generation_;
      return ok(current);
    }
    case Op::kDelete: {
      auto it = map_.find(keys[0]);
      if (it == map_.end()) return ok(0);
      bytes_ -= cost(keys[0], it->second.size());
      map_.erase(it);
      return ok(1);
    }
    case Op::kCheck:
      return ok(missing(keys).empty() ? 1 : 0);
    case Op::kNumKeys:
      return ok(static_cast<std::int64_t>(map_.size()));
    case Op::kWait:
      if (!missing(keys).empty()) return std::nullopt;
      return ok();
    case Op::kAppend: {
      auto it = map_.find(keys[0]);
      const std::size_t before = it == map_.end() ? 0 : it->second.size();
      const std::size_t after = before + values[0].size();
      if (auto refused = over_value_cap(request.op, keys[0], after)) return refused;
      if (auto refused = over_table_cap(request.op, keys, growth(keys[0], after))) return refused;
      bytes_ = static_cast<std::uint64_t>(static_cast<std::int64_t>(bytes_) + growth(keys[0], after));
      // In place: a long value is not copied to grow it.
      auto& v = map_[keys[0]];
      v.insert(v.end(), values[0].begin(), values[0].end());
      ++generation_;
      return ok();
    }
    case Op::kMultiGet: {
      if (!missing(keys).empty()) return std::nullopt;
      // Note [Replies are sized first]: one stored key named N times would make the
      // server copy N values (a 245-byte request, a gigabyte) before the reply's
      // size was looked at. The size is summed from the table instead, and a reply
      // over the cap is an error that copies nothing.
      std::size_t reply_bytes = 1 + 8 + 4 + 4;  // status, number, no keys, the values' count
      for (const auto& k : keys) {
        reply_bytes += 4 + map_.at(k).size();
        if (reply_bytes > options_.max_reply_bytes()) break;
      }
      if (reply_bytes > options_.max_reply_bytes())
        return error(fmt::format("cohort: a MULTI_GET of {} would need a reply of more than {} bytes, over the "
                                 "store's limit of {} bytes per reply (StoreServerOptions::max_buffer_bytes); fetch "
                                 "fewer keys at once",
                                 shown(keys), options_.max_reply_bytes(), options_.max_reply_bytes()));
      std::vector<Bytes> out;
      out.reserve(keys.size());
      for (const auto& k : keys) out.push_back(map_.at(k));
      return ok(0, std::move(out));
    }
    case Op::kMultiSet: {
      // All or nothing: every value and the table's size after the whole request are
      // checked before any key is written. A key given twice ends with its last value.
      std::unordered_map<std::string, std::size_t> last;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (auto refused = over_value_cap(request.op, keys[i], values[i].size())) return refused;
        last[keys[i]] = values[i].size();
      }
      std::int64_t grow = 0;
      for (const auto& [key, size] : last) grow += growth(key, size);
      if (auto refused = over_table_cap(request.op, keys, grow)) return refused;
      for (std::size_t i = 0; i < keys.size(); ++i) put(keys[i], values[i]);
      ++generation_;
      return ok();
    }
    case Op::kProve: break;  // the connection's business, not the table's (ServerLoop::handle)
  }
  return error("cohort: unknown store request");
}

}  // namespace cohort::store
