#include "cohort/launcher/etcd_record.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cohort/store/etcd_options.h"
#include "cohort/store/store_ops.h"
#include "cohort/util/bytes.h"

namespace cohort::launcher {

ForgetsFinishedJob::~ForgetsFinishedJob() {
  if (!store_.etcd || lost_) return;
  try {
    const auto s = rdzv_.read();
    if (!s.closed || !s.participants.empty() || !s.wait_list.empty()) return;
    store::delete_etcd_prefix(*store_.etcd);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cohort run: warning: could not delete the finished job's keys in etcd ({}): {}\n",
               store_.etcd->prefix(), e.what());
  }
}

void clear_abandoned_record(elastic::DynamicRendezvous& rdzv, const AgentStore& store,
                            const std::function<void()>& check) {
  if (!store.etcd) return;
  using Clock = std::chrono::steady_clock;
  const auto key = rdzv.key("state");
  const auto seen = store::look(rdzv.store(), key);
  if (!seen) return;  // no record: a new job
  const auto s = elastic::decode(util::from_bytes(*seen));
  if (s.closed) return;  // a finished job's: closed_record_hint
  const auto& settings = rdzv.settings();
  const auto interval = settings.keep_alive_interval();
  if (!s.participants.empty() || !s.wait_list.empty()) {
    const auto quiet_for = interval * (settings.keep_alive_max_missed() + 1);
    const auto until = Clock::now() + quiet_for;
    while (Clock::now() < until) {
      const auto now = store::look(rdzv.store(), key);
      if (!now || *now != *seen) return;  // a live job, or one cleared by another agent
      check();
      std::this_thread::sleep_for(std::min<Clock::duration>(interval / 4, until - Clock::now()));
    }
  }
  if (!store::delete_etcd_prefix_if(*store.etcd, key, *seen)) return;  // it changed meanwhile: live after all
  fmt::print(stderr, "cohort run: the record in etcd under {} was a job that no agent runs any more (round {}, {} "
                     "node(s) in it, no heartbeat for {:.1f} s); its keys are deleted and this job starts anew\n",
             store.etcd->prefix(), s.round, s.participants.size() + s.wait_list.size(),
             std::chrono::duration<double>(interval * (settings.keep_alive_max_missed() + 1)).count());
}

std::string stale_record_hint(const AgentStore& store) {
  if (!store.etcd) return "";
  return fmt::format("\n  (under etcd: if no agent of that job is running, the record is a killed job's; give this "
                     "job a --rdzv-id of its own, or delete the old one's keys: etcdctl --endpoints={} del --prefix "
                     "{})",
                     fmt::join(store.etcd->endpoints(), ","), store.etcd->prefix());
}

std::string closed_record_hint(const AgentStore& store, const std::string& run_id) {
  if (!store.etcd) return "";
  return fmt::format("cohort run: the job's record in etcd (keys under {}) says that job (--rdzv-id {}) has "
                     "finished. If this is a new job, give it a --rdzv-id of its own, or delete the old job's keys: "
                     "etcdctl --endpoints={} del --prefix {}\n",
                     store.etcd->prefix(), run_id, fmt::join(store.etcd->endpoints(), ","), store.etcd->prefix());
}

}  // namespace cohort::launcher
