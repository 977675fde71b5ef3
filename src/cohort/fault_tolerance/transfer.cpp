#include "cohort/fault_tolerance/transfer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <sstream>

#include "cohort/errors.h"

namespace cohort::fault_tolerance {

namespace {

constexpr std::int64_t kFormat = 1;

[[noreturn]] void missing(const char* what, int replica) {
  throw ConfigError(fmt::format("cohort: fault tolerance: replica {} must {} another replica's training state, but "
                                "no on_transfer() functions were given\n  fix: call replicas.on_transfer(save, load) "
                                "before the first begin_step() (docs/fault_tolerance.md)",
                                replica, what));
}

}  // namespace

TransferResult transfer_state(comm::Group& group, const QuorumRecord& record, int index, std::int64_t step,
                              const std::function<void(std::ostream&)>& save,
                              const std::function<void(std::istream&)>& load, int shards_per_replica) {
  TransferResult result;
  const auto top = record.max_step();
  const auto& me = record.members[static_cast<size_t>(index)];
  const int shard = me.id % shards_per_replica;
  const int source = record.source_of(shard, shards_per_replica);
  TORCH_CHECK(source >= 0, "transfer_state: no source for shard ", shard, " (check shard_without_source first)");
  if (index == source) {
    if (!save) missing("send", me.id);
    std::ostringstream out;
    save(out);
    const auto text = out.str();
    auto header = at::tensor({kFormat, step, static_cast<std::int64_t>(text.size())}, at::kLong);
    auto payload = at::empty({static_cast<std::int64_t>(text.size())}, at::kByte);
    if (!text.empty()) std::memcpy(payload.data_ptr(), text.data(), text.size());
    for (size_t i = 0; i < record.members.size(); ++i) {
      if (record.members[i].step == top || record.members[i].id % shards_per_replica != shard) continue;
      group.send(header, static_cast<int>(i), 0);
      group.send(payload, static_cast<int>(i), 1);
      ++result.sent;
    }
    result.bytes = static_cast<std::int64_t>(text.size());
    return result;
  }
  if (me.step == top) return result;
  if (!load) missing("receive", me.id);
  auto header = at::zeros({3}, at::kLong);
  group.recv(header, source, 0);
  const auto* h = header.data_ptr<std::int64_t>();
  if (h[0] != kFormat || h[2] < 0)
    throw CommError(fmt::format("cohort: fault tolerance: replica {} received a state header it does not know "
                                "(format {}, {} bytes) from replica {}; are both running the same cohort?",
                                me.id, h[0], h[2], record.members[static_cast<size_t>(source)].id));
  auto payload = at::empty({h[2]}, at::kByte);
  group.recv(payload, source, 1);
  std::istringstream in(std::string(static_cast<const char*>(payload.data_ptr()), static_cast<size_t>(h[2])));
  load(in);
  result.received = true;
  result.step = h[1];
  result.bytes = h[2];
  return result;
}

}  // namespace cohort::fault_tolerance
