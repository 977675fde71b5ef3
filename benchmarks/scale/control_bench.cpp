// The control plane at N ranks (issue 47; docs/scale.md): N agents or replicas,
// each a thread with its own TCP client of cohort's real store (StoreServer in
// this process, StoreClient per thread), speaking the real protocols:
//   --what rendezvous   N DynamicRendezvous agents join one elastic round of N
//                       (elastic/dynamic_rendezvous.h);
//   --what quorum       N replicas form quorum 1, then quorum 2 after replica N-1
//                       is published dead the way the launcher publishes it
//                       (fault_tolerance/quorum.h, launcher/in_process.h's keys).
// Each run prints one JSON line per measure; scale/run_control.sh drives the Ns.
//   control_bench --what rendezvous|quorum --n N [--repeats R]
// Times: from the last agent's (replica's) arrival, the moment its own join or
// arrival call began, to the moment the last of them had its assignment; for the
// death, from the death's publication to every survivor's quorum. Store traffic:
// the server's requests and bytes are not visible to the client, so each client
// counts its own calls (a wrapping store) and the bytes of the keys and values it
// sent and received.
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "cohort/elastic/dynamic_rendezvous.h"
#include "cohort/fault_tolerance/quorum.h"
#include "cohort/store/counting_store.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "cohort/util/bytes.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace ft = cohort::fault_tolerance;
namespace el = cohort::elastic;

// Every thread waits here until all N have come (std::barrier is C++20).
class Gate {
 public:
  explicit Gate(int n) : left_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (--left_ == 0) {
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return left_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int left_;
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void raise_fd_limit(int n) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  const auto want = static_cast<rlim_t>(4 * n + 256);
  if (lim.rlim_cur < want) {
    lim.rlim_cur = std::min(want, lim.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// The machine's 1-minute load average: these figures are of 2 cores shared by N
// client threads and the server, so a busy machine shows in them.
double load_average() {
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

struct Run {
  std::string token = "scale-bench-token-0123456789abcdef0123456789";
  cohort::store::StoreServer server{cohort::store::StoreServerOptions(token)};

  c10::intrusive_ptr<cohort::store::CountingStore> client() {
    auto inner = c10::make_intrusive<cohort::store::StoreClient>("127.0.0.1", server.port(), token,
                                                                 std::chrono::seconds(120));
    return c10::make_intrusive<cohort::store::CountingStore>(inner);
  }
};

struct Totals {
  std::int64_t calls = 0, bytes = 0;
  void add(const cohort::store::CountingStore& s) {
    calls += s.calls();
    bytes += s.bytes();
  }
};

nlohmann::json rendezvous_once(int n) {
  Run run;
  std::vector<c10::intrusive_ptr<cohort::store::CountingStore>> stores;
  for (int i = 0; i < n; ++i) stores.push_back(run.client());
  std::vector<Clock::time_point> began(n), done(n);
  Gate start(n);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      el::RendezvousSettings settings(n, n);
      settings.join_timeout(std::chrono::seconds(600)).last_call_timeout(std::chrono::seconds(30));
      el::DynamicRendezvous rdzv(stores[i], "bench", fmt::format("node-{:05d}", i), settings);
      start.arrive_and_wait();
      began[i] = Clock::now();
      try {
        rdzv.next_round();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "agent %d: %s\n", i, e.what());
        ++failures;
      }
      done[i] = Clock::now();
    });
  for (auto& t : threads) t.join();
  Totals totals;
  for (auto& s : stores) totals.add(*s);
  const auto last_arrival = *std::max_element(began.begin(), began.end());
  const auto first_arrival = *std::min_element(began.begin(), began.end());
  const auto last_done = *std::max_element(done.begin(), done.end());
  const auto first_done = *std::min_element(done.begin(), done.end());
  const auto record = stores[0]->get("cohort/rdzv/bench/state");
  return {{"what", "rendezvous"},
          {"n", n},
          {"failures", failures.load()},
          {"ms_last_arrival_to_first_assigned", ms_between(last_arrival, first_done)},
          {"ms_last_arrival_to_all_assigned", ms_between(last_arrival, last_done)},
          {"ms_first_arrival_to_all_assigned", ms_between(first_arrival, last_done)},
          {"store_calls", totals.calls},
          {"store_bytes", totals.bytes},
          {"record_bytes", record.size()}};
}

// Waits (bounded) until `count` replicas have arrived at quorum `target`.
void await_arrivals(c10d::Store& store, std::int64_t target, int count) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  const auto key = ft::keys::quorum(target) + "/count";
  while (store.add(key, 0) < count) {
    if (Clock::now() > deadline) throw std::runtime_error(fmt::format("{} arrivals at quorum {} not seen", count, target));
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a poll of the counter
  }
}

// Quorums of N replicas, three ways:
//  1. burst: all N arrive at once at quorum 1 (a job's start);
//  2. last: N-1 have arrived at quorum 2 and wait; the last one arrives (a step
//     boundary where one replica is late): from its arrival to every decision;
//  3. death: N-1 have arrived at quorum 3, expecting the N of quorum 2; replica
//     N-1 is then published dead as the launcher publishes it
//     (launcher/in_process.h): from the publication to every decision.
nlohmann::json quorum_once(int n) {
  Run run;
  std::vector<c10::intrusive_ptr<cohort::store::CountingStore>> stores;
  for (int i = 0; i < n; ++i) stores.push_back(run.client());
  auto observer = run.client();
  ft::FormRules rules;
  rules.max_replicas = n;
  rules.min_replicas = 1;
  rules.wait_for_expected = std::chrono::seconds(60);
  struct Phase {
    std::vector<Clock::time_point> began, formed;
    std::vector<std::size_t> sizes;
    std::vector<std::int64_t> calls, bytes;
    explicit Phase(int n) : began(n), formed(n), sizes(n), calls(n), bytes(n) {}
  };
  Phase burst(n), last(n), death(n);
  Gate start(n + 1), go_last(2);
  std::atomic<int> failures{0};
  auto form = [&](Phase& phase, int i, std::int64_t target, std::int64_t step) {
    auto& store = *stores[i];
    const auto calls = store.calls(), bytes = store.bytes();
    phase.began[i] = Clock::now();
    try {
      phase.sizes[i] = ft::form_quorum(store, target, {i, 0, step}, rules).members.size();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "replica %d, quorum %lld: %s\n", i, static_cast<long long>(target), e.what());
      ++failures;
    }
    phase.formed[i] = Clock::now();
    phase.calls[i] = store.calls() - calls;
    phase.bytes[i] = store.bytes() - bytes;
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      form(burst, i, 1, 0);
      if (i == n - 1) go_last.arrive_and_wait();
      form(last, i, 2, 1);
      if (i < n - 1) form(death, i, 3, 2);
    });
  start.arrive_and_wait();
  Clock::time_point published;
  try {
    await_arrivals(*observer, 2, n - 1);
    go_last.arrive_and_wait();
    await_arrivals(*observer, 3, n - 1);
    published = Clock::now();
    observer->set(ft::keys::dead(n - 1), cohort::util::to_bytes("0"));
    const auto e = observer->add(ft::keys::events(), 1);
    observer->set(ft::keys::event(e), cohort::util::to_bytes(fmt::format("dead {} 0", n - 1)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(1);  // the replicas would wait for their deadlines
  }
  for (auto& t : threads) t.join();
  auto summary = [&](const Phase& p, int count, std::size_t size, Clock::time_point from) {
    const auto first = *std::min_element(p.formed.begin(), p.formed.begin() + count);
    const auto last_formed = *std::max_element(p.formed.begin(), p.formed.begin() + count);
    std::int64_t calls = 0, bytes = 0;
    bool ok = true;
    for (int i = 0; i < count; ++i) {
      calls += p.calls[static_cast<size_t>(i)];
      bytes += p.bytes[static_cast<size_t>(i)];
      ok = ok && p.sizes[static_cast<size_t>(i)] == size;
    }
    return nlohmann::json{{"ms_to_first_decided", ms_between(from, first)},
                          {"ms_to_all_decided", ms_between(from, last_formed)},
                          {"store_calls", calls},
                          {"store_bytes", bytes},
                          {"sizes_ok", ok}};
  };
  const auto burst_from = *std::max_element(burst.began.begin(), burst.began.end());
  return {{"what", "quorum"},
          {"n", n},
          {"failures", failures.load()},
          {"burst", summary(burst, n, static_cast<std::size_t>(n), burst_from)},
          {"last", summary(last, n, static_cast<std::size_t>(n), last.began[static_cast<size_t>(n - 1)])},
          {"death", summary(death, n - 1, static_cast<std::size_t>(n - 1), published)},
          {"store_keys", observer->getNumKeys()}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("cohort's control plane at N agents or replicas (docs/scale.md)");
  std::string what = "quorum";
  int n = 8, repeats = 3;
  app.add_option("--what", what)->check(CLI::IsMember({"rendezvous", "quorum"}));
  app.add_option("--n", n)->check(CLI::Range(2, 100000));
  app.add_option("--repeats", repeats)->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  raise_fd_limit(n);
  for (int r = 0; r < repeats; ++r) {
    auto line = what == "rendezvous" ? rendezvous_once(n) : quorum_once(n);
    line["repeat"] = r;
    line["load"] = load_average();
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
