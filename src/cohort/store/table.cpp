#include "cohort/store/table.h"

#include <stdexcept>

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

}  // namespace

std::vector<std::string> Table::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (map_.count(k) == 0) out.push_back(k);
  return out;
}

std::optional<Reply> Table::apply(const Request& request) {
  const auto& keys = request.keys;
  const auto& values = request.values;
  switch (request.op) {
    case Op::kSet:
      map_[keys[0]] = values[0];
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
      const Bytes& expected = values[0];
      auto it = map_.find(keys[0]);
      if ((it == map_.end() && expected.empty()) || (it != map_.end() && it->second == expected)) {
        map_[keys[0]] = values[1];
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
          return error("cohort: store key '" + keys[0] + "' holds a value that is not an integer, so ADD cannot "
                       "count on it; use a key of its own for the counter");
        }
      }
      // A peer's delta is any int64; overflowing would be undefined behaviour in the
      // server (found by fuzz_store_wire), so it is this request's error instead.
      if (__builtin_add_overflow(current, request.number, &current)) {
        return error("cohort: ADD of " + std::to_string(request.number) + " to store key '" + keys[0] +
                     "' overflows a 64-bit integer; the counter is left as it was");
      }
      map_[keys[0]] = to_bytes(std::to_string(current));
      ++generation_;
      return ok(current);
    }
    case Op::kDelete:
      return ok(map_.erase(keys[0]) > 0 ? 1 : 0);
    case Op::kCheck:
      return ok(missing(keys).empty() ? 1 : 0);
    case Op::kNumKeys:
      return ok(static_cast<std::int64_t>(map_.size()));
    case Op::kWait:
      if (!missing(keys).empty()) return std::nullopt;
      return ok();
    case Op::kAppend: {
      auto& v = map_[keys[0]];
      v.insert(v.end(), values[0].begin(), values[0].end());
      ++generation_;
      return ok();
    }
    case Op::kMultiGet: {
      if (!missing(keys).empty()) return std::nullopt;
      std::vector<Bytes> out;
      out.reserve(keys.size());
      for (const auto& k : keys) out.push_back(map_.at(k));
      return ok(0, std::move(out));
    }
    case Op::kMultiSet:
      for (std::size_t i = 0; i < keys.size(); ++i) map_[keys[i]] = values[i];
      ++generation_;
      return ok();
  }
  return error("cohort: unknown store request");
}

}  // namespace cohort::store
