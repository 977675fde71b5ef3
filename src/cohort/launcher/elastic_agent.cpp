#include "cohort/launcher/elastic_agent.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "cohort/comm/rendezvous.h"
#include "cohort/elastic/dynamic_rendezvous.h"
#include "cohort/launcher/agent_store.h"
#include "cohort/launcher/failure_record.h"
#include "cohort/launcher/worker_group.h"
#include "cohort/util/bytes.h"
#include "cohort/util/host.h"

namespace cohort::launcher {
namespace {

using elastic::DynamicRendezvous;
using elastic::RendezvousState;
using elastic::Round;
using Clock = std::chrono::steady_clock;
constexpr auto kLook = std::chrono::milliseconds(50);

struct SignalReceived {
  int sig;
};
// The round this agent is in has changed under it: join the next one.
struct RoundChanged {};

int pending_signal(int fd) {
  unsigned char sigs[16];
  ssize_t n;
  while ((n = read(fd, sigs, sizeof sigs)) > 0)
    for (ssize_t i = 0; i < n; ++i)
      if (sigs[i] != SIGCHLD) return sigs[i];
  return 0;
}

// Heartbeats from a thread of their own, so they go on while the agent waits in a
// round or watches its workers. A store error is kept for the main thread.
class KeepAlive {
 public:
  explicit KeepAlive(DynamicRendezvous& rdzv) : rdzv_(rdzv), thread_([this] { loop(); }) {}
  ~KeepAlive() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Throws CommError when the store has stopped answering.
  void rethrow() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw CommError(error_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      std::string failed;
      try {
        for (const auto& node : rdzv_.keep_alive())
          fmt::print(stderr, "cohort run: node {} stopped sending heartbeats; dropped from the job\n", node);
      } catch (const std::exception& e) {
        failed = e.what();
      }
      lock.lock();
      if (!failed.empty()) {
        error_ = failed;
        return;
      }
      cv_.wait_for(lock, rdzv_.settings().keep_alive_interval(), [this] { return stop_; });
    }
  }

  DynamicRendezvous& rdzv_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string error_;
  std::thread thread_;
};

std::string node_name() {
  std::random_device rd;
  return fmt::format("{}:{}:{:04x}", util::host_name(), getpid(), rd() & 0xffff);
}

bool round_changed(const RendezvousState& s, const Round& r, const std::string& node) {
  return s.closed || s.round != r.round || !s.participants.count(node) ||
         static_cast<int>(s.participants.size()) != r.world_size || elastic::nodes_waiting(s) > 0;
}

std::string round_key(const Round& r, const std::string& what) { return fmt::format("round/{}/{}", r.round, what); }

// Every node publishes its worker count; ranks follow node ranks. Polled, so the
// keep-alive thread is never held up, and abandoned when the round changes (a node
// died before publishing).
Assignment agree_ranks(DynamicRendezvous& rdzv, const Round& r, int nproc, const std::function<void()>& check) {
  auto& store = rdzv.store();
  store.set(rdzv.key(round_key(r, "size/" + std::to_string(r.rank))), util::to_bytes(std::to_string(nproc)));
  std::vector<std::string> keys;
  for (int n = 0; n < r.world_size; ++n) keys.push_back(rdzv.key(round_key(r, "size/" + std::to_string(n))));
  const auto deadline = Clock::now() + rdzv.settings().join_timeout();
  while (!store.check(keys)) {
    if (round_changed(rdzv.read(), r, rdzv.node())) throw RoundChanged{};
    if (Clock::now() >= deadline)
      throw TimeoutError("cohort run: the nodes of the round did not all publish their worker counts within "
                         "join_timeout",
                         "rendezvous", {});
    check();
    std::this_thread::sleep_for(kLook);
  }
  std::vector<int> sizes;
  for (const auto& k : keys) sizes.push_back(std::stoi(util::from_bytes(store.get(k))));
  return assign_ranks(sizes, r.rank);
}

enum class Verdict { kFailure, kMembership, kClosed };

// Note [Elastic agent loop]: was this round's failure a failure, or a lost node?
Verdict classify(DynamicRendezvous& rdzv, const Round& r, bool own, const std::function<void()>& check) {
  if (own) return Verdict::kFailure;
  const auto& st = rdzv.settings();
  const auto deadline = Clock::now() + st.keep_alive_interval() * st.keep_alive_max_missed() + std::chrono::seconds(2);
  while (true) {
    const auto s = rdzv.read();
    if (s.closed) return Verdict::kClosed;
    if (s.failed_round >= r.round) return Verdict::kFailure;
    for (const auto& rec : read_failure_records(rdzv, r))
      if (rec.own) return Verdict::kFailure;
    if (s.round != r.round || static_cast<int>(s.participants.size()) < r.world_size) return Verdict::kMembership;
    if (Clock::now() >= deadline) return Verdict::kFailure;
    check();
    std::this_thread::sleep_for(kLook * 2);
  }
}

int report_closed(DynamicRendezvous& rdzv) {
  auto cause = read_root_cause(rdzv);
  if (cause.empty()) {
    fmt::print(stderr, "cohort run: the job has finished; nothing left for this node to do\n");
    return 0;
  }
  fmt::print(stderr, "{}", cause);
  return 1;
}

// Every worker here exited 0. The agent hosting the store keeps it up until the
// other nodes are done too (or have stopped sending heartbeats), then closes the job.
int finish(DynamicRendezvous& rdzv, const Round& r, bool hosting, const std::function<void()>& check) {
  rdzv.store().set(rdzv.key(round_key(r, "done/" + rdzv.node())), util::to_bytes("1"));
  if (!hosting) return 0;
  const auto deadline = Clock::now() + rdzv.settings().join_timeout();
  while (Clock::now() < deadline) {
    const auto s = rdzv.read();
    bool waiting = false;
    for (const auto& node : r.nodes)
      if (s.participants.count(node) && !rdzv.store().check({rdzv.key(round_key(r, "done/" + node))})) waiting = true;
    if (!waiting || s.closed) break;
    check();
    std::this_thread::sleep_for(kLook * 2);
  }
  rdzv.update([](RendezvousState& s) {
    s.closed = true;
    return true;
  });
  return 0;
}

}  // namespace

int run_elastic_agent(const AgentSetup& setup) {
  const auto& o = setup.options;
  const auto token = resolve_token(o, setup.env);
  const auto settings = elastic::parse_rdzv_conf(o.rdzv_conf, elastic::RendezvousSettings(o.min_nodes, o.max_nodes));
  auto store = open_agent_store(o, token, settings.join_timeout());
  if (store.server)
    fmt::print(stderr, "cohort run: this agent hosts the rendezvous store on {}:{}\n", store.host, store.port);
  DynamicRendezvous rdzv(store.client, setup.run_id, node_name(), settings);
  KeepAlive keep_alive(rdzv);
  auto check = [&] {
    if (int sig = pending_signal(setup.signal_fd)) throw SignalReceived{sig};
    keep_alive.rethrow();
  };
  comm::EnvMap env = setup.env;
  env["COHORT_AGENT_STORE"] = "cohort";
  env["COHORT_RDZV_TOKEN"] = token;
  int attempt = 0;
  try {
    while (true) {
      Round r;
      Assignment a;
      const auto joining = Clock::now();
      try {
        r = rdzv.next_round(check);
        a = agree_ranks(rdzv, r, setup.nproc, check);
      } catch (const RoundChanged&) {
        rdzv.leave();
        continue;
      }
      env["COHORT_STORE_PREFIX"] = fmt::format("/cohort/{}/round_{}/worker", setup.run_id, r.round);
      fmt::print(stderr,
                 "cohort run: round {}: node {} of {}, ranks {}..{} of {} (failure restarts so far: {} of {}; "
                 "rendezvous {:.3f} s)\n",
                 r.round, a.group_rank, a.group_world_size, a.base_rank, a.base_rank + setup.nproc - 1, a.world_size,
                 r.restarts, o.max_restarts, std::chrono::duration<double>(Clock::now() - joining).count());
      AttemptContext context{store.host, store.port, static_cast<int>(r.restarts), setup.run_id};
      WorkerGroup group(o, env, setup.program, a, setup.nproc, context, setup.attempt_dir(attempt++),
                        setup.signal_fd);
      group.on_tick([&] {
        keep_alive.rethrow();
        return round_changed(rdzv.read(), r, rdzv.node());
      });
      const auto result = group.monitor();
      if (result.received_signal) throw SignalReceived{result.received_signal};
      if (result.success) return finish(rdzv, r, store.server != nullptr, check);
      if (!result.interrupted) {
        const auto record = post_failure_record(rdzv, r, result, FailureContext{util::host_name(), setup.run_id,
                                                                                 static_cast<int>(r.restarts),
                                                                                 o.max_restarts});
        const auto verdict = classify(rdzv, r, record.own, check);
        if (verdict == Verdict::kClosed) return report_closed(rdzv);
        if (verdict == Verdict::kFailure) {
          bool go_on = true;
          rdzv.update([&](RendezvousState& s) {
            go_on = elastic::count_failure(s, r.round, o.max_restarts);
            return go_on;
          });
          if (!go_on) {
            close_with_root_cause(rdzv, r);
            return report_closed(rdzv);
          }
          fmt::print(stderr, "{}cohort run: restarting the workers of every node (failure restart {} of {})\n",
                     record.summary, rdzv.read().restarts, o.max_restarts);
        } else {
          fmt::print(stderr, "cohort run: a node left the job; restarting the workers at the new size (no "
                             "restart used)\n");
        }
      } else {
        if (rdzv.read().closed) return report_closed(rdzv);
        fmt::print(stderr, "cohort run: the job's membership changed; restarting the workers at the new size (no "
                           "restart used)\n");
      }
      rdzv.leave();
    }
  } catch (const SignalReceived& s) {
    try {
      rdzv.leave();
    } catch (const std::exception&) {
    }
    fmt::print(stderr, "cohort run: stopped by signal {}; every worker has exited\n",
               sigabbrev_np(s.sig) ? sigabbrev_np(s.sig) : "?");
    return 128 + s.sig;
  } catch (const elastic::RendezvousClosedError&) {
    return report_closed(rdzv);
  } catch (const CommError& e) {
    fmt::print(stderr,
               "cohort run: lost the rendezvous store at {}:{}: {}\n  The agent hosting it (the one on the "
               "--rdzv-endpoint host) has most likely exited, and the job cannot go on without it; every worker here "
               "has been stopped. Restart the job (it resumes from its last checkpoint).\n",
               store.host, store.port, e.what());
    return 1;
  }
}

}  // namespace cohort::launcher
