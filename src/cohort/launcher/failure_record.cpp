#include "cohort/launcher/failure_record.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/util/bytes.h"
#include "cohort/util/json_integer.h"

namespace cohort::launcher {
namespace {

// Long enough for a peer node's agent to settle its own workers and post.
constexpr auto kGatherFor = std::chrono::milliseconds(2500);

std::string record_key(elastic::DynamicRendezvous& rdzv, const elastic::Round& r, const std::string& node) {
  return rdzv.key(fmt::format("round/{}/failure/{}", r.round, node));
}

}  // namespace

FailureRecord post_failure_record(elastic::DynamicRendezvous& rdzv, const elastic::Round& r,
                                  const AttemptResult& result, const FailureContext& context) {
  FailureRecord rec;
  const WorkerOutcome* root = root_cause(result.in_exit_order);
  rec.own = root && !is_casualty(*root) && !root->stopped_by_launcher;
  rec.time_ms = root ? root->exited_at_ms : 0;
  rec.summary = failure_summary(result.in_exit_order, context);
  nlohmann::json j = {{"own", rec.own}, {"time_ms", rec.time_ms}, {"summary", rec.summary}};
  rdzv.store().set(record_key(rdzv, r, rdzv.node()), util::to_bytes(j.dump()));
  return rec;
}

std::vector<FailureRecord> read_failure_records(elastic::DynamicRendezvous& rdzv, const elastic::Round& r) {
  std::vector<FailureRecord> out;
  for (const auto& node : r.nodes) {
    const auto key = record_key(rdzv, r, node);
    if (!rdzv.store().check({key})) continue;
    try {
      const auto j = nlohmann::json::parse(util::from_bytes(rdzv.store().get(key)));
      // Note [Integers from JSON]: a record in the store is input like any other.
      out.push_back({j.at("own").get<bool>(), util::json_integer_at<std::int64_t>(j, "time_ms"),
                     j.at("summary").get<std::string>()});
    } catch (const nlohmann::json::exception&) {
      // Not ours to read: leave it out of the root cause.
    }
  }
  return out;
}

void close_with_root_cause(elastic::DynamicRendezvous& rdzv, const elastic::Round& r, const std::string& why,
                           const std::function<void()>& check) {
  auto records = read_failure_records(rdzv, r);
  const auto finished = rdzv.read().done.size();  // nodes that finished post no record
  const auto until = std::chrono::steady_clock::now() + kGatherFor;
  while (records.size() + finished < r.nodes.size() && std::chrono::steady_clock::now() < until) {
    if (check) check();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    records = read_failure_records(rdzv, r);
  }
  // Own failures first, then the earliest.
  std::sort(records.begin(), records.end(), [](const FailureRecord& a, const FailureRecord& b) {
    return a.own != b.own ? a.own : a.time_ms < b.time_ms;
  });
  std::string text = records.empty() ? std::string("cohort run: the job failed (no node left a record of a failed "
                                                  "worker)\n")
                                      : records.front().summary;
  text += "cohort run: " + why + "; the job is closed on every node\n";
  close_with_text(rdzv, text);
}

void close_with_text(elastic::DynamicRendezvous& rdzv, const std::string& text) {
  rdzv.store().set(rdzv.key("root_cause"), util::to_bytes(text));
  rdzv.update([](elastic::RendezvousState& s) {
    s.closed = true;
    return true;
  });
}

std::string read_root_cause(elastic::DynamicRendezvous& rdzv) {
  const auto key = rdzv.key("root_cause");
  if (!rdzv.store().check({key})) return "";
  return util::from_bytes(rdzv.store().get(key));
}

}  // namespace cohort::launcher
