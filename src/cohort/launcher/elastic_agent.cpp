#include "cohort/launcher/elastic_agent.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <optional>
#include <random>
#include <set>
#include <thread>

#include "cohort/comm/rendezvous.h"
#include "cohort/elastic/dynamic_rendezvous.h"
#include "cohort/launcher/agent_store.h"
#include "cohort/launcher/etcd_record.h"
#include "cohort/launcher/failure_record.h"
#include "cohort/launcher/in_process.h"
#include "cohort/launcher/keep_alive.h"
#include "cohort/launcher/restart_pacing.h"
#include "cohort/launcher/round_end.h"
#include "cohort/launcher/signal_pipe.h"
#include "cohort/launcher/stock_worker_watch.h"
#include "cohort/launcher/worker_store.h"
#include "cohort/launcher/vacant_slots.h"
#include "cohort/launcher/worker_group.h"
#include "cohort/store/etcd_options.h"
#include "cohort/util/bytes.h"
#include "cohort/util/host.h"

namespace cohort::launcher {
namespace {

using elastic::DynamicRendezvous;
using elastic::RendezvousState;
using elastic::Round;
using Clock = std::chrono::steady_clock;
constexpr auto kLook = std::chrono::milliseconds(50);

// The round this agent is in has changed under it: join the next one.
struct RoundChanged {};

std::string node_name() {
  std::random_device rd;
  const std::uint64_t salt = (static_cast<std::uint64_t>(rd()) << 32) | rd();
  return fmt::format("{}:{}:{:016x}", util::host_name(), getpid(), salt);
}

bool round_changed(const RendezvousState& s, const Round& r, const std::string& node) {
  // Note [Held rounds]: only the job's end, or this node dropped, stops a held round.
  if (r.held) return s.closed || s.round != r.round || !s.participants.count(node);
  // A waiting node is taken in by a restart, unless the round is already finishing.
  return s.closed || s.round != r.round || !s.participants.count(node) ||
         static_cast<int>(s.participants.size()) != r.world_size || (elastic::nodes_waiting(s) > 0 && s.done.empty());
}

std::string round_key(const Round& r, const std::string& what) { return fmt::format("round/{}/{}", r.round, what); }

// Every node publishes its worker count; ranks follow node ranks. Polled, so the
// keep-alive thread is never held up, and abandoned when the round changes (a node
// died before publishing). `sizes` receives every node's worker count.
Assignment agree_ranks(DynamicRendezvous& rdzv, const Round& r, int nproc, const std::function<void()>& check,
                       std::vector<int>& sizes) {
  auto& store = rdzv.store();
  // Note [Held rounds]: a node that takes a vacant slot runs that slot's workers.
  const auto mine = rdzv.key(round_key(r, "size/" + std::to_string(r.rank)));
  if (r.held && store.check({mine})) {
    const int slot_size = std::stoi(util::from_bytes(store.get(mine)));
    if (slot_size != nproc)
      throw UsageError(fmt::format("--nproc-per-node {}: this node takes slot {} of a job under --fault-tolerance "
                                   "in-process, whose node there ran {} workers; the job keeps the shape it started "
                                   "with.\n  fix: start this node with --nproc-per-node {}",
                                   nproc, r.rank, slot_size, slot_size));
  }
  store.set(mine, util::to_bytes(std::to_string(nproc)));
  std::vector<std::string> keys;
  for (int n = 0; n < r.world_size; ++n) keys.push_back(rdzv.key(round_key(r, "size/" + std::to_string(n))));
  const auto deadline = Clock::now() + rdzv.settings().join_timeout();
  while (!store.check(keys)) {
    if (round_changed(rdzv.read(), r, rdzv.node())) throw RoundChanged{};
    if (Clock::now() >= deadline)
      throw TimeoutError("the nodes of the round did not all publish their worker counts within "
                         "join_timeout",
                         "rendezvous", {});
    check();
    std::this_thread::sleep_for(kLook);
  }
  sizes.clear();
  for (const auto& k : keys) sizes.push_back(std::stoi(util::from_bytes(store.get(k))));
  return assign_ranks(sizes, r.rank);
}

// Note [In-process fault tolerance: the keys]: the agent's own client of the
// workers' store, each operation bounded by 10 s.
c10::intrusive_ptr<c10d::Store> workers_view(const AgentStore& store, const std::string& prefix) {
  auto own = store.another();
  own->setTimeout(std::chrono::seconds(10));
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(own));
}

// The job's --nnodes and --max-restarts, fixed by its first agent in the record
// (Note [Rendezvous rounds]); returns the job's restart limit. Throws UsageError,
// leaving the record as it was, when this agent's --nnodes is not the job's.
std::int64_t adopt_job_settings(DynamicRendezvous& rdzv, const RunOptions& o, const std::string& stale_hint) {
  const std::pair<int, int> mine{o.min_nodes, o.max_nodes};
  std::pair<int, int> job = mine;
  const bool held = in_process_fault_tolerance(o);
  bool job_held = held;
  std::int64_t max_restarts = o.max_restarts;
  rdzv.update([&](RendezvousState& s) {
    const bool unset = s.max_restarts < 0 || s.max_nodes <= 0;
    job_held = elastic::adopt_held(s, held);  // before adopt_nnodes: Note [Held rounds]
    job = elastic::adopt_nnodes(s, o.min_nodes, o.max_nodes);
    if (job != mine || job_held != held) return false;
    max_restarts = elastic::adopt_max_restarts(s, o.max_restarts);
    return unset;
  });
  if (job != mine) {
    const auto theirs = elastic::nnodes_text(job.first, job.second);
    throw UsageError(fmt::format("--nnodes {}: this job (--rdzv-id {}) runs with --nnodes {}, set by its first "
                                 "agent; agents that disagree on the number of nodes would never agree on a round, "
                                 "so this one does not join (the job goes on without it).\n  fix: start every "
                                 "agent of the job with --nnodes {}{}",
                                 elastic::nnodes_text(mine.first, mine.second), o.run_id, theirs, theirs, stale_hint));
  }
  if (job_held != held)
    throw UsageError(fmt::format("--fault-tolerance {}: this job (--rdzv-id {}) runs with --fault-tolerance {}, set "
                                 "by its first agent; one node restarting every worker while another replaces them "
                                 "alone would never agree, so this agent does not join.\n  fix: start every agent of "
                                 "the job with --fault-tolerance {}{}",
                                 o.fault_tolerance, o.run_id, job_held ? "in-process" : "none",
                                 job_held ? "in-process" : "none", stale_hint));
  if (max_restarts != o.max_restarts)
    fmt::print(stderr, "cohort run: warning: this job runs with --max-restarts {}, set by its first agent; this "
                       "agent's --max-restarts {} is ignored{}\n",
               max_restarts, o.max_restarts, stale_hint);
  return max_restarts;
}

// The agent's store: the job's etcd, or cohort's store hosted by the agent on the
// --rdzv-endpoint host (Note [Who hosts the store]).
AgentStore open_store(const AgentSetup& setup, const elastic::RendezvousSettings& settings,
                      std::chrono::milliseconds silent_bound, const std::string& token,
                      const std::shared_ptr<StockWorkerWatch>& watch) {
  auto check = [&] {
    if (int sig = pending_signal(setup.signal_fd)) throw SignalReceived{sig};
  };
  if (uses_etcd(setup.options))
    return open_etcd_agent_store(setup.options, setup.env, setup.run_id, settings.join_timeout(), silent_bound,
                                 check);
  return open_agent_store(setup.options, token, resolve_certificates(setup.env), settings.join_timeout(), check,
                          watch);
}

}  // namespace

int run_elastic_agent(const AgentSetup& setup) {
  const auto& o = setup.options;
  // Note [--rdzv-backend etcd]: etcd's own authentication and TLS stand in for the
  // job's token and certificates.
  const auto token = uses_etcd(o) ? std::string() : resolve_token(o, setup.env);
  const auto settings = elastic::parse_rdzv_conf(rendezvous_conf(o), elastic::RendezvousSettings(o.min_nodes, o.max_nodes));
  // Every request after the connection is answered at once by a live store; a store
  // that stays silent for the heartbeat bound is as good as gone.
  const auto silent_bound = std::max<std::chrono::milliseconds>(
      settings.keep_alive_interval() * settings.keep_alive_max_missed(), std::chrono::seconds(5));
  AgentStore store;
  // Note [Telling a stock worker from a port scan]
  const auto watch = std::make_shared<StockWorkerWatch>(::getpid());
  try {
    store = open_store(setup, settings, silent_bound, token, watch);
  } catch (const SignalReceived& s) {
    fmt::print(stderr, "cohort run: stopped by signal {} while reaching the store\n", sigabbrev_np(s.sig));
    return 128 + s.sig;
  }
  if (store.server)
    fmt::print(stderr, "cohort run: this agent hosts the rendezvous store on {}:{}\n", store.host, store.port);
  const bool hosting = store.server != nullptr;
  const auto role = store.etcd ? StoreRole::kReplicated : hosting ? StoreRole::kHost : StoreRole::kClient;
  store.client->setTimeout(silent_bound);
  const auto node = node_name();
  DynamicRendezvous rdzv(store.client, setup.run_id, node, settings);
  // Destroyed after the heartbeats below have stopped: no beat may write the record again.
  ForgetsFinishedJob forgets(rdzv, store);
  try {
    clear_abandoned_record(rdzv, store, [&] {
      if (int sig = pending_signal(setup.signal_fd)) throw SignalReceived{sig};
    });
  } catch (const SignalReceived& s) {
    fmt::print(stderr, "cohort run: stopped by signal {} while looking at the job's record\n", sigabbrev_np(s.sig));
    return 128 + s.sig;
  }
  // Before anything joins: an agent that disagrees with the job is refused here.
  const auto max_restarts = adopt_job_settings(rdzv, o, stale_record_hint(store));
  // Heartbeats on a connection of their own, never queued behind the main thread.
  DynamicRendezvous beats(store.another(), setup.run_id, node, settings);
  KeepAlive keep_alive(beats);
  auto check = [&] {
    if (int sig = pending_signal(setup.signal_fd)) throw SignalReceived{sig};
    keep_alive.rethrow();
  };
  auto leave_quietly = [&] {
    try {
      rdzv.leave();
    } catch (const std::exception&) {
      // The store is gone or silent: nothing to leave.
    }
  };
  auto stopped_by = [&](int sig) {
    leave_quietly();
    fmt::print(stderr, "cohort run: stopped by signal {}; every worker has exited\n",
               sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
    return 128 + sig;
  };
  // Note [Restart pacing]: waits on the signal pipe, still a participant of the
  // failed round, so the next round starts after the slowest node's pause.
  RestartPacing pacing(restart_pacing_for(o.monitor_interval));
  auto pause_before_restart = [&](Clock::duration ran_for) {
    const auto pause = pacing.after_failure(std::chrono::duration_cast<std::chrono::milliseconds>(ran_for));
    fmt::print(stderr, "{}", pacing.explain(pause));
    const auto until = Clock::now() + pause;
    for (auto left = pause; left.count() > 0;
         left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now())) {
      if (int sig = wait_for_signal(setup.signal_fd, std::min(left, std::chrono::milliseconds(250))))
        throw SignalReceived{sig};
      keep_alive.rethrow();
    }
  };
  // Note [The workers' store]: with a plain TCPStore the workers get no token.
  const bool tcpstore = settings.worker_store() == elastic::WorkerStore::kTcpStore;
  RoundTcpStore round_store(store.client, setup.run_id, hosting, store.host, settings.join_timeout());
  // Note [Variables the launcher owns]: none of an outer job's may leak in.
  comm::EnvMap env = without_launcher_variables(setup.env);
  if (store.etcd) {
    // Note [Workers find etcd through their environment]
    // The members in the agent's order: the first answered it (Note [The first member that answers]).
    const auto members = fmt::format("{}", fmt::join(store.etcd->endpoints(), ","));
    for (auto& [name, value] : store::etcd_worker_variables(members, etcd_conf(o))) env[name] = value;
  } else if (!tcpstore) {
    env["COHORT_AGENT_STORE"] = "cohort";
    env["COHORT_RDZV_TOKEN"] = token;
  }
  int attempt = 0;
  try {
    while (true) {
      Round r;
      Assignment a;
      std::vector<int> sizes;
      const auto joining = Clock::now();
      try {
        r = rdzv.next_round(check);
        a = agree_ranks(rdzv, r, setup.nproc, check, sizes);
      } catch (const RoundChanged&) {
        rdzv.leave();
        continue;
      }
      if (!tcpstore) env["COHORT_STORE_PREFIX"] = fmt::format("/cohort/{}/round_{}/worker", setup.run_id, r.round);
      fmt::print(stderr,
                 "cohort run: round {}: node {} of {}, ranks {}..{} of {} (failure restarts so far: {} of {}; "
                 "rendezvous {:.3f} s)\n",
                 r.round, a.group_rank, a.group_world_size, a.base_rank, a.base_rank + setup.nproc - 1, a.world_size,
                 r.restarts, max_restarts, std::chrono::duration<double>(Clock::now() - joining).count());
      AttemptContext context{store.host, store.port, static_cast<int>(r.restarts), setup.run_id};
      if (tcpstore) {
        const auto workers_store = round_store.for_round(r.round, check);
        context.store_addr = workers_store.host;
        context.store_port = workers_store.port;
      }
      context.max_restarts = static_cast<int>(max_restarts);  // the job's, not this agent's flag
      // Note [Held rounds]: a dead worker is replaced alone (launcher/in_process.h).
      std::optional<InProcessRestarts> in_process;
      std::optional<VacantSlots> vacant;
      if (r.held) {
        in_process.emplace(workers_view(store, env.at("COHORT_STORE_PREFIX")), static_cast<int>(max_restarts));
        context.first_incarnation = in_process->first_incarnation(a.group_rank);
        if (role != StoreRole::kClient) vacant.emplace(*in_process, rdzv, r, sizes, role);
      }
      const auto started = Clock::now();
      WorkerGroup group(o, env, setup.program, a, setup.nproc, context, setup.attempt_dir(attempt++),
                        setup.signal_fd);
      if (in_process) {
        group.on_worker_failure(
            [&](const WorkerOutcome& dead, int incarnation) { return in_process->on_death(dead, incarnation); });
        group.on_training_finished([&] { return in_process->finished_at(); });
      }
      group.on_tick([&] {
        keep_alive.rethrow();
        const auto s = rdzv.read();
        if (vacant) vacant->look(s);
        return watch->sighting() || round_changed(s, r, rdzv.node());
      });
      const auto result = group.monitor();
      group.print_report();
      const auto ran_for = Clock::now() - started;
      if (result.received_signal) throw SignalReceived{result.received_signal};
      if (const auto seen = watch->sighting()) {
        close_with_text(rdzv, "cohort run: error: " + *seen + "\n");  // no restart mends it
        report_closed(rdzv, role, check);
        return 2;
      }
      if (r.held && !result.interrupted) {
        // Note [Held rounds]: the other nodes train on; this one waits for them to
        // finish, keeping the store up if it hosts it.
        if (!result.success)
          fmt::print(stderr, "{}{}",
                     failure_summary(result.in_exit_order,
                                     FailureContext{util::host_name(), setup.run_id, static_cast<int>(r.restarts),
                                                    static_cast<int>(max_restarts)}),
                     in_process->summary(result.in_exit_order));
        const int code = finish(rdzv, r, role, check);
        if (result.success) return code;
        // Note [A job that ends on a configuration error] (agent.cpp): a worker that
        // stopped on a refusal was not replaced, and the job says so with exit 2.
        const WorkerOutcome* cause = root_cause(result.in_exit_order);
        return cause && repeats_in_a_replacement(*cause) ? 2 : 1;
      }
      // Workers stopped for a change may exit 0 (a trainer that saves on SIGTERM):
      // that is an interruption, not the end of the job.
      if (result.success && !result.interrupted) return finish(rdzv, r, role, check);
      if (!result.interrupted) {
        const auto record = post_failure_record(rdzv, r, result, FailureContext{util::host_name(), setup.run_id,
                                                                                 static_cast<int>(r.restarts),
                                                                                 static_cast<int>(max_restarts)});
        // Note [Failures after a node finished]: no restart once a node is done.
        if (const auto why = reason_to_close_after_finish(rdzv.read(), r, true); !why.empty()) {
          close_with_root_cause(rdzv, r, why, check);
          return report_closed(rdzv, role, check);
        }
        const auto verdict = classify(rdzv, r, record.own, check);
        if (verdict == Verdict::kClosed) return report_closed(rdzv, role, check);
        if (verdict == Verdict::kFailure) {
          bool go_on = true;
          rdzv.update([&](RendezvousState& s) {
            go_on = elastic::count_failure(s, r.round);
            return go_on;
          });
          if (!go_on) {
            close_with_root_cause(rdzv, r,
                                  fmt::format("no restarts left (--max-restarts {} used by the job as a whole)",
                                              rdzv.read().restarts),
                                  check);
            return report_closed(rdzv, role, check);
          }
          fmt::print(stderr, "{}cohort run: restarting the workers of every node (failure restart {} of {})\n",
                     record.summary, rdzv.read().restarts, max_restarts);
          pause_before_restart(ran_for);
        } else {
          fmt::print(stderr, "cohort run: a node left the job; restarting the workers at the new size (no "
                             "restart used)\n");
        }
      } else {
        const auto s = rdzv.read();
        if (s.closed) return report_closed(rdzv, role, check);
        if (const auto why = reason_to_close_after_finish(s, r, false); !why.empty()) {
          close_with_root_cause(rdzv, r, why, check);
          return report_closed(rdzv, role, check);
        }
        if (s.failed_round >= r.round) {
          fmt::print(stderr, "cohort run: another node's workers failed; restarting the workers of every node "
                             "(failure restart {} of {})\n",
                     s.restarts, max_restarts);
          pause_before_restart(ran_for);
        } else if (r.held) {
          fmt::print(stderr, "cohort run: this node was dropped from the job (its heartbeats were late) and its "
                             "workers were stopped; it joins again as a newcomer, into a vacant slot (no restart "
                             "used)\n");
        } else {
          fmt::print(stderr, "cohort run: the job's membership changed; restarting the workers at the new size "
                             "(no restart used)\n");
        }
      }
      rdzv.leave();
    }
  } catch (const SignalReceived& s) {
    return stopped_by(s.sig);
  } catch (const elastic::RendezvousClosedError&) {
    // Under etcd a closed record met before any round may be another job's: no work
    // was done here, and a scheduler must not read that as success.
    if (attempt == 0 && store.etcd) {
      fmt::print(stderr, "{}", closed_record_hint(store, setup.run_id));
      leave_quietly();
      return 2;
    }
    try {
      return report_closed(rdzv, role, check);
    } catch (const SignalReceived& s) {
      return stopped_by(s.sig);
    }
  } catch (const TimeoutError& e) {
    if (e.operation() == "rendezvous") {
      leave_quietly();
      throw;
    }
    forgets.store_lost();
    fmt::print(stderr, "cohort run: the rendezvous store at {} stopped answering: {}\n  Every worker here has "
                       "been stopped. Restart the job (it resumes from its last checkpoint).\n",
               store.where(), e.what());
    return 1;
  } catch (const CommError& e) {
    forgets.store_lost();
    if (store.etcd) {
      fmt::print(stderr, "cohort run: lost the job's etcd ({}): {}\n  No member of the etcd cluster could serve "
                         "this agent: most likely a majority of its members is down, and etcd serves nothing "
                         "without a quorum. Every worker here has been stopped. Bring back a majority of the etcd "
                         "members (`etcdctl endpoint health`), then restart the job (it resumes from its last "
                         "checkpoint).\n",
                 store.where(), e.what());
      return 1;
    }
    fmt::print(stderr,
               "cohort run: lost the rendezvous store at {}:{}: {}\n  The agent hosting it (the one on the "
               "--rdzv-endpoint host) has most likely exited, and the job cannot go on without it; every worker here "
               "has been stopped. Restart the job (it resumes from its last checkpoint).\n",
               store.host, store.port, e.what());
    return 1;
  } catch (...) {
    leave_quietly();  // peers need not wait out the heartbeat bound
    throw;
  }
}

}  // namespace cohort::launcher
