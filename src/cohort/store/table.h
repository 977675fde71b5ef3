#pragma once
// The store server's keys and values, and what each request does to them, with the
// semantics of c10d's TCPStore and HashStore. No sockets and no clocks: the server
// parks a request that cannot complete yet and retries it after a write.
//
//   cohort::store::Table table(cohort::store::TableOptions().max_value_bytes(1 << 20));
//   auto reply = table.apply(request);  // nullopt: park it and retry after a write
#include <torch/arg.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cohort/store/wire.h"

namespace cohort::store {

// Note [Store memory caps]
// Anyone holding the job's token can write to the store, and without a bound a
// buggy or hostile peer could grow the server's memory until the agent hosting the
// rendezvous dies (and the job with it). So the table refuses, with an error reply
// that names the cap, a write that would make one value longer than
// max_value_bytes (SET, COMPARE_SET's desired value, each MULTI_SET value, the
// result of APPEND, a counter's text) or the table's size larger than
// max_table_bytes. The size counts what memory holds, not only what was sent: each
// key's and value's lengths plus kEntryOverheadBytes per key, the hash table's node,
// bucket and allocations around them. Measured (launcher-store repro D1): 3 million
// keys of 6 bytes took 310 MB of RSS, about 103 bytes a key, while lengths alone
// counted 18 MB, so a 1 GiB cap admitted about 18 GiB. A refused write leaves the table
// as it was: a MULTI_SET is checked whole before any of it is applied. The size is
// kept exactly (bytes_) across every write, so a DELETE or a shorter overwrite
// frees room at once. The default value cap sits well below the protocol's frame
// limit (kMaxFramePayload, 256 MiB), so any value stored can also be read back.
inline constexpr std::size_t kDefaultMaxValueBytes = std::size_t{64} << 20;
inline constexpr std::size_t kDefaultMaxTableBytes = std::size_t{1} << 30;
// What one key costs beyond its key's and value's lengths (libstdc++, 64-bit): the
// unordered_map node (next pointer, cached hash, std::string, std::vector: 80
// bytes, 96 with malloc's header), its bucket pointer, and the value's own
// allocation (at least 32 bytes with its header). Rounded up: overcounting only
// lowers the cap a little, undercounting let memory run away.
inline constexpr std::size_t kEntryOverheadBytes = 160;

struct TableOptions {
  // The longest value one key may hold.
  TORCH_ARG(std::size_t, max_value_bytes) = kDefaultMaxValueBytes;
  // The most the table may hold in all: keys' and values' lengths summed, plus
  // entry_overhead_bytes per key.
  TORCH_ARG(std::size_t, max_table_bytes) = kDefaultMaxTableBytes;
  // What each key is counted for beyond its lengths (Note [Store memory caps]); 0
  // counts lengths alone, as tests of the arithmetic do.
  TORCH_ARG(std::size_t, entry_overhead_bytes) = kEntryOverheadBytes;
  // The longest reply payload: a MULTI_GET whose reply would be longer is refused
  // before any value is copied (Note [Replies are sized first]).
  TORCH_ARG(std::size_t, max_reply_bytes) = kMaxFramePayload;
};

class Table {
 public:
  explicit Table(TableOptions options = {}) : options_(options) {}

  // The reply to `request`, or nullopt when it waits for keys that do not exist yet
  // (GET, WAIT and MULTI_GET). A write over a cap is an error reply
  // (Note [Store memory caps]).
  std::optional<Reply> apply(const Request& request);

  // Those of `keys` that do not exist, in order.
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;

  // Grows with every write, so a caller can tell whether parked requests may now complete.
  std::uint64_t generation() const { return generation_; }

  // The keys' and values' lengths summed, plus entry_overhead_bytes per key: what
  // max_table_bytes bounds.
  std::uint64_t size_bytes() const { return bytes_; }

 private:
  // The error reply when a value of `value_size` bytes for `keys` is over
  // max_value_bytes, or when growing the table by `grow` bytes (negative: it
  // shrinks) takes it over max_table_bytes; nullopt when the write may go ahead.
  std::optional<Reply> over_value_cap(Op op, const std::string& key, std::size_t value_size) const;
  std::optional<Reply> over_table_cap(Op op, const std::vector<std::string>& keys, std::int64_t grow) const;
  // What `key` holding `value_size` bytes counts for (Note [Store memory caps]).
  std::size_t cost(const std::string& key, std::size_t value_size) const;
  // The bytes the table gains when `key` comes to hold `value_size` bytes.
  std::int64_t growth(const std::string& key, std::size_t value_size) const;
  // Stores `value` under `key`, keeping bytes_ exact.
  void put(const std::string& key, Bytes value);

  TableOptions options_;
  std::unordered_map<std::string, Bytes> map_;
  std::uint64_t bytes_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace cohort::store
