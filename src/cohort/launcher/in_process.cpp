#include "cohort/launcher/in_process.h"

#include <fmt/format.h>
#include <string.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "cohort/util/bytes.h"

namespace cohort::launcher {

std::string ft_dead_key(int rank) { return fmt::format("cohort/ft/dead/{}", rank); }

std::string ft_event_key(std::int64_t n) { return fmt::format("cohort/ft/event/{}", n); }

std::string ft_node_starts_key(int node_rank) { return fmt::format("cohort/ft/node_starts/{}", node_rank); }

std::int64_t publish_death(c10d::Store& store, int rank, int incarnation) {
  // Never lowered: a stopped agent that resumes and reaps its stale worker must not
  // bring back incarnations that the agent hosting the store published dead with
  // their lost node (Note [Published dead is out] in fault_tolerance/quorum.cpp).
  const auto key = ft_dead_key(rank);
  const bool lower = store.check({key}) && std::stoi(util::from_bytes(store.get(key))) >= incarnation;
  if (!lower) store.set(key, util::to_bytes(std::to_string(incarnation)));
  const auto n = store.add(kFtEventsKey, 1);
  store.set(ft_event_key(n), util::to_bytes(fmt::format("dead {} {}", rank, incarnation)));
  return n;
}

std::string describe_death(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* name = sigabbrev_np(sig);
    return name ? fmt::format("was killed by SIG{}", name) : fmt::format("was killed by signal {}", sig);
  }
  return fmt::format("exited with code {}", WEXITSTATUS(wait_status));
}

std::string death_line(int rank, int incarnation, pid_t pid, int wait_status, int restart, int max_restarts) {
  const auto head = fmt::format("cohort run: worker {} (incarnation {}, pid {}) {}; ", rank, incarnation, pid,
                                describe_death(wait_status));
  if (restart > 0)
    return head + fmt::format("restarting only this worker (fault tolerance in-process, restart {} of {})\n", restart,
                              max_restarts);
  return head + fmt::format("not replaced: --max-restarts {} spent; the others go on\n", max_restarts);
}

std::string frozen_note(int rank, int incarnation, pid_t pid, double frozen_timeout) {
  return fmt::format("cohort run: worker {} (incarnation {}, pid {}) has been stopped (SIGSTOP) for over {:g} s "
                     "(--frozen-timeout); not killed under --fault-tolerance in-process: the others drop it from "
                     "their quorum and take it back when it resumes (SIGCONT)\n",
                     rank, incarnation, pid, frozen_timeout);
}

std::string stopped_after_the_end_line(int rank, int incarnation, pid_t pid, double frozen_timeout,
                                       std::int64_t finished_at) {
  return fmt::format("cohort run: worker {} (incarnation {}, pid {}) has been stopped (SIGSTOP) for over {:g} s "
                     "(--frozen-timeout) and training finished without it at step {}; killed, not replaced: the "
                     "job's result stands\n",
                     rank, incarnation, pid, frozen_timeout, finished_at);
}

std::optional<std::int64_t> InProcessRestarts::finished_at() const {
  try {
    if (!store_->check({kFtFinishedKey})) return std::nullopt;
    return std::stoll(util::from_bytes(store_->get(kFtFinishedKey)));
  } catch (const std::exception&) {
    return std::nullopt;  // not known: the worker stays, as before
  }
}

bool repeats_in_a_replacement(const WorkerOutcome& outcome) {
  return outcome.error && outcome.error->message.rfind("cohort::ConfigError", 0) == 0;
}

InProcessRestarts::InProcessRestarts(c10::intrusive_ptr<c10d::Store> workers_store, int max_restarts)
    : store_(std::move(workers_store)), max_restarts_(max_restarts) {}

int InProcessRestarts::first_incarnation(int node_rank) {
  const auto starts = store_->add(ft_node_starts_key(node_rank), 1);
  if (starts > 1)
    fmt::print(stderr, "cohort run: node {} joins a job in progress (start {} of this node); its workers join the "
                       "others' next quorum and take the state from a live one\n",
               node_rank, starts);
  return static_cast<int>((starts - 1) * (max_restarts_ + 1));
}

FailureAction InProcessRestarts::on_death(const WorkerOutcome& outcome, int incarnation) {
  const int rank = outcome.slot.rank;
  try {
    publish_death(*store_, rank, incarnation);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cohort run: warning: could not publish the death of worker {} on the job's store: {}\n", rank,
               e.what());
  }
  // Note [A restart that cannot help]
  if (repeats_in_a_replacement(outcome)) {
    ++not_replaced_;
    fmt::print(stderr, "cohort run: worker {} (incarnation {}, pid {}) {}; not replaced: it stopped on a "
                       "configuration error, which a replacement with the same environment would repeat (no restart "
                       "used); the others go on:\n  {}\n",
               rank, incarnation, outcome.pid, describe_death(outcome.wait_status), outcome.error->message);
    std::fflush(stderr);
    return FailureAction::kLeave;
  }
  const bool replace = used_ < max_restarts_;
  if (replace)
    ++used_;
  else
    ++not_replaced_;
  fmt::print(stderr, "{}", death_line(rank, incarnation, outcome.pid, outcome.wait_status, replace ? used_ : 0,
                                      max_restarts_));
  std::fflush(stderr);
  return replace ? FailureAction::kReplace : FailureAction::kLeave;
}

bool InProcessRestarts::publish_lost_slot(int slot, int first_rank, int count,
                                          const std::function<bool()>& still_vacant) {
  try {
    auto starts = store_->add(ft_node_starts_key(slot), 0);
    if (starts == 0) starts = store_->add(ft_node_starts_key(slot), 1);  // lost before it counted itself
    if (!still_vacant()) return false;  // a newcomer took it: its workers are not to be marked
    const auto last = static_cast<int>(starts * (max_restarts_ + 1) - 1);
    for (int rank = first_rank; rank < first_rank + count; ++rank) publish_death(*store_, rank, last);
    fmt::print(stderr, "cohort run: node slot {} is vacant (its agent stopped sending heartbeats); its workers {}..{} "
                       "are published dead for the others, who train on without them\n",
               slot, first_rank, first_rank + count - 1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cohort run: warning: could not publish the workers of vacant node slot {} as dead: {}; the "
                       "others drop them at their deadlines\n",
               slot, e.what());
  }
  std::fflush(stderr);
  return true;
}

std::string InProcessRestarts::summary(const std::vector<WorkerOutcome>& in_exit_order) const {
  std::map<int, bool> failed;  // by local rank; a later incarnation's exit overwrites an earlier one's
  for (const auto& o : in_exit_order) failed[o.slot.local_rank] = !o.succeeded();
  const auto count = std::count_if(failed.begin(), failed.end(), [](const auto& f) { return f.second; });
  return fmt::format("cohort run: fault tolerance in-process: {} worker(s) not replaced or failed in their last "
                     "incarnation, {} of --max-restarts {} single-worker restart(s) used\n",
                     count, used_, max_restarts_);
}

namespace {
std::string node_beat_key(int node) { return fmt::format("cohort/ft/node_beat/{}", node); }
std::string node_done_key(int node) { return fmt::format("cohort/ft/node_done/{}", node); }
}  // namespace

StaticNodeBeats::StaticNodeBeats(c10::intrusive_ptr<c10d::Store> workers_store, std::vector<int> node_sizes,
                                 int node_rank, std::chrono::milliseconds lost_after)
    : store_(std::move(workers_store)),
      sizes_(std::move(node_sizes)),
      node_(node_rank),
      lost_after_(lost_after),
      seen_(sizes_.size()) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& s : seen_) s.since = now;  // a node that never beats is silent from here
}

void StaticNodeBeats::tick(InProcessRestarts& restarts) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_beat_ < kBeatEvery) return;
  last_beat_ = now;
  try {
    store_->add(node_beat_key(node_), 1);
    if (node_ != 0) return;
    int first_rank = 0;
    for (int n = 0; n < static_cast<int>(sizes_.size()); first_rank += sizes_[static_cast<size_t>(n)], ++n) {
      if (n == node_) continue;
      auto& seen = seen_[static_cast<size_t>(n)];
      const auto beat = store_->add(node_beat_key(n), 0);
      if (beat != seen.beat) {
        seen = {beat, now, false};
        continue;
      }
      if (seen.published || now - seen.since < lost_after_ || store_->check({node_done_key(n)})) continue;
      seen.published = true;  // once per silence; a node started again beats and is watched afresh
      const auto count = sizes_[static_cast<size_t>(n)];
      restarts.publish_lost_slot(n, first_rank, count, [&] { return store_->add(node_beat_key(n), 0) == beat; });
    }
  } catch (const std::exception& e) {
    // Node 0 hosts the store: failing to reach it means this agent's own trouble,
    // which its workers will show; the beats are only a way to be quicker.
    if (!warned_)
      fmt::print(stderr, "cohort run: warning: could not beat or read the nodes' beats on the job's store: {}\n",
                 e.what());
    warned_ = true;
  }
}

void StaticNodeBeats::done() {
  try {
    store_->set(node_done_key(node_), util::to_bytes("1"));
  } catch (const std::exception&) {
  }
}

}  // namespace cohort::launcher
