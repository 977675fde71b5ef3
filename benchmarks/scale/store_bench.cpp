// The store at scale: cohort's StoreServer against c10d's TCPStore with N clients,
// each its own connection driven by its own thread. For each operation, the ops/s of
// all clients together and each operation's latency (p50, p99), the median of
// --repeats runs, and the server's CPU time per operation. The server runs in a
// child process (this binary with --serve, Note [The --serve protocol] in
// server_process.h). One JSON line per operation on stdout, a table on stderr.
// docs/scale.md ("The store") says how to read it; run_store.sh runs both stores.
//
//   scale_store_bench --store cohort --clients 1024
//   scale_store_bench --store tcpstore --clients 64 --smoke
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <limits>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cohort/compat/c10d.h"
#include "cohort/compat/tcp_store.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "gate.h"
#include "server_process.h"
#include "stats.h"

namespace {

using cohort::bench::Gate;
using cohort::bench::PhaseResult;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;
using Bytes = std::vector<std::uint8_t>;
constexpr const char* kTokenVariable = "COHORT_STORE_BENCH_TOKEN";

struct Args {
  std::string store = "cohort";
  int clients = 8;
  double seconds = 2;  // each timed phase
  int warmup_ops = 3;   // per client, before each timed phase
  int active = 0;       // clients that run the timed phases; 0: all (Note [Idle clients])
  int repeats = 3;
  int broadcast_rounds = 5;
  int value_bytes = 64;
  int multi_keys = 8;
  int connect_parallel = 32;
  int timeout_s = 120;
  bool smoke = false;
  bool serve = false;
};

double us_since(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::micro>(end - start).count();
}

// Note [Descriptors at 1,024 clients]: each client is a socket in this process and
// one in the server's (two here for 1.13's TCPStore, whose clients also open a
// connection for watchKey callbacks); the soft limit goes up to the hard one.
void raise_open_files_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

// This process's user + system CPU time so far, all threads, in microseconds.
// With system_only, the time in the kernel alone.
double own_cpu_us(bool system_only = false) {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto us = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec); };
  return system_only ? us(usage.ru_stime) : us(usage.ru_utime) + us(usage.ru_stime);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// --serve: Note [The --serve protocol].
int serve(const Args& args) {
  raise_open_files_limit();
  const auto timeout = std::chrono::seconds(args.timeout_s);
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  std::unique_ptr<cohort::store::StoreServer> ours;
  int port = 0;
  std::string backend = "cohort";
  if (args.store == "cohort") {
    const char* token = std::getenv(kTokenVariable);
    if (!token || !*token) throw std::runtime_error(std::string("--serve needs the token in ") + kTokenVariable);
    ours = std::make_unique<cohort::store::StoreServer>(cohort::store::StoreServerOptions(token));
    port = ours->port();
  } else {
    tcp = cohort::compat::make_tcp_store_server(cohort::compat::TcpStoreBackend::kLibUv, timeout);
    port = tcp->getPort();
    backend = cohort::compat::tcp_store_backend_name(*tcp);
  }
  std::cout << "port " << port << " backend " << backend << std::endl;
  for (std::string line; std::getline(std::cin, line);)
    if (line == "cpu") std::cout << fmt::format("{:.0f} {:.0f}", own_cpu_us(), own_cpu_us(true)) << std::endl;
  return 0;
}

// One client's connection and the keys it works on.
struct Client {
  c10::intrusive_ptr<c10d::Store> store;
  std::string key;      // set, get, check, wait
  std::string cas_key;  // compare_set flips it between two values
  bool cas_flipped = false;
  std::vector<std::string> multi_keys;
};

class Bench {
 public:
  Bench(const Args& args, cohort::bench::ServerProcess& server, std::string token)
      : args_(args),
        server_(server),
        token_(std::move(token)),
        timeout_(std::chrono::seconds(args.timeout_s)),
        value_a_(static_cast<std::size_t>(args.value_bytes), 'a'),
        value_b_(static_cast<std::size_t>(args.value_bytes), 'b') {}

  c10::intrusive_ptr<c10d::Store> connect() const {
    if (args_.store == "cohort")
      return c10::make_intrusive<cohort::store::StoreClient>("127.0.0.1", server_.port(), token_, timeout_);
    return cohort::compat::make_tcp_store("127.0.0.1", static_cast<std::uint16_t>(server_.port()), false, timeout_);
  }

  // Connects every client, --connect-parallel at a time, and stores its keys.
  PhaseResult connect_all() {
    const auto n = static_cast<std::size_t>(args_.clients);
    clients_.resize(n);
    std::vector<double> latencies(n);
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> threads;
    std::mutex failure_mutex;
    std::string failure;
    const auto start = Clock::now();
    for (int t = 0; t < std::min(args_.connect_parallel, args_.clients); ++t) {
      threads.emplace_back([&] {
        try {
          for (std::size_t i; (i = next++) < n;) {
            const auto t0 = Clock::now();
            auto& c = clients_[i];
            c.store = connect();
            latencies[i] = us_since(t0, Clock::now());
            c.key = fmt::format("k/{}", i);
            c.cas_key = fmt::format("cas/{}", i);
            for (int k = 0; k < args_.multi_keys; ++k) c.multi_keys.push_back(fmt::format("k/{}", (i + k) % n));
            c.store->set(c.key, value_a_);
            c.store->set(c.cas_key, value_a_);
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (failure.empty()) failure = e.what();
          next = n;
        }
      });
    }
    for (auto& t : threads) t.join();
    if (!failure.empty()) throw std::runtime_error("connecting the clients: " + failure);
    PhaseResult r;
    r.ops_per_s = static_cast<double>(n) / (us_since(start, Clock::now()) / 1e6);
    r.p50_us = cohort::bench::percentile(latencies, 0.5);
    r.p99_us = cohort::bench::percentile(latencies, 0.99);
    r.fewest_share = 1;  // each connected once
    setter_ = connect();
    return r;
  }

  // Every client runs `op` for --seconds after a warm-up of --warmup-ops, all
  // starting together (Note [A fixed duration]).
  //
  // Note [A fixed duration]: with a fixed count per client, the first threads to
  // wake finished their share against an idle server before the last ones woke
  // (1,024 threads on two cores take milliseconds to start), so the clients seldom
  // overlapped. For a fixed time, every client keeps one request in flight
  // throughout, as workers hammering a store do; ops/s counts what completed until
  // each client saw the end (one op past it at most). fewest_share tells whether
  // the server served them alike.
  //
  // Note [Idle clients]: with --active K, only K clients run the timed phases while
  // the other N - K stay connected and silent, as most of a big job's workers are
  // between rendezvous rounds. A server that visits every connection on every
  // wake-up then pays for all N on each of the K clients' requests: server us/op
  // against N at K = 1 shows that cost alone.
  template <class Op>
  PhaseResult timed(Op op) {
    const auto n = args_.active > 0 ? std::min<std::size_t>(args_.active, clients_.size()) : clients_.size();
    std::vector<std::vector<double>> latencies(n);
    Gate gate;
    std::atomic<bool> stop{false};
    std::mutex failure_mutex;
    std::string failure;
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        bool arrived = false;
        try {
          auto& c = clients_[i];
          for (int w = 0; w < args_.warmup_ops; ++w) op(c);
          arrived = true;
          gate.arrive();
          if (!gate.wait_open(timeout_)) return;
          latencies[i].reserve(1024);
          while (!stop.load(std::memory_order_relaxed)) {
            const auto t0 = Clock::now();
            op(c);
            latencies[i].push_back(us_since(t0, Clock::now()));
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (failure.empty()) failure = e.what();
          stop = true;
          if (!arrived) gate.arrive();
        }
      });
    }
    const bool all = gate.wait_arrivals(n, timeout_);
    const auto server0 = server_.cpu_us();
    const double client0 = own_cpu_us();
    const auto start = Clock::now();
    gate.open(all && failure.empty());
    std::this_thread::sleep_for(std::chrono::duration<double>(args_.seconds));  // the measured window
    stop = true;
    for (auto& t : threads) t.join();
    const auto end = Clock::now();
    const auto server1 = server_.cpu_us();
    const double client1 = own_cpu_us();
    if (!failure.empty()) throw std::runtime_error(failure);
    if (!all) throw std::runtime_error(fmt::format("the {} clients' warm-up took over {} s", n, args_.timeout_s));
    std::vector<double> merged;
    std::size_t fewest = std::numeric_limits<std::size_t>::max();
    for (const auto& l : latencies) {
      merged.insert(merged.end(), l.begin(), l.end());
      fewest = std::min(fewest, l.size());
    }
    PhaseResult r;
    const double ops = static_cast<double>(merged.size());
    r.ops_per_s = ops / (us_since(start, end) / 1e6);
    r.p50_us = cohort::bench::percentile(merged, 0.5);
    r.p99_us = cohort::bench::percentile(merged, 0.99);
    r.server_cpu_us_per_op = (server1.total - server0.total) / ops;
    r.server_sys_us_per_op = (server1.system - server0.system) / ops;
    r.client_cpu_us_per_op = (client1 - client0) / ops;
    r.fewest_share = static_cast<double>(fewest) * static_cast<double>(n) / ops;
    return r;
  }

  // Note [The broadcast case]: every client waits for one key that does not exist
  // yet; once all have sent their wait (each thread has started it, then a pause
  // of 20 ms + 100 us per client lets the requests reach the server; a pause only
  // starts the clock later, it cannot make a figure wrong), another client sets the
  // key. Latency: from just before that set to each waiter's return. ops_per_s:
  // waiters released per second, N over the time until the last returned.
  PhaseResult broadcast(int repeat) {
    const auto n = clients_.size();
    std::vector<double> latencies, rates;
    double cpu = 0;
    for (int round = 0; round < args_.broadcast_rounds; ++round) {
      const std::string key = fmt::format("bcast/{}/{}", repeat, round);
      std::vector<Clock::time_point> returned(n);
      Gate gate;
      std::mutex failure_mutex;
      std::string failure;
      std::vector<std::thread> threads;
      for (std::size_t i = 0; i < n; ++i) {
        threads.emplace_back([&, i] {
          try {
            gate.arrive();
            clients_[i].store->wait({key}, timeout_);
            returned[i] = Clock::now();
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(failure_mutex);
            if (failure.empty()) failure = e.what();
          }
        });
      }
      const bool all = gate.wait_arrivals(n, timeout_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20) + std::chrono::microseconds(100) * n);
      const double cpu0 = server_.cpu_us().total;
      const auto start = Clock::now();
      setter_->set(key, value_a_);  // releases the waiters even when some failed
      for (auto& t : threads) t.join();
      cpu += server_.cpu_us().total - cpu0;
      if (!failure.empty()) throw std::runtime_error(failure);
      if (!all) throw std::runtime_error(fmt::format("the {} waiters took over {} s to start", n, args_.timeout_s));
      double last = 0;
      for (const auto& t : returned) {
        latencies.push_back(us_since(start, t));
        last = std::max(last, latencies.back());
      }
      rates.push_back(static_cast<double>(n) / (last / 1e6));
    }
    PhaseResult r;
    r.ops_per_s = cohort::bench::median(rates);
    r.p50_us = cohort::bench::percentile(latencies, 0.5);
    r.p99_us = cohort::bench::percentile(latencies, 0.99);
    r.server_cpu_us_per_op = cpu / static_cast<double>(latencies.size());
    r.fewest_share = 1;  // each released once a round
    return r;
  }

  PhaseResult run(const std::string& op, int repeat) {
    if (op == "set") return timed([&](Client& c) { c.store->set(c.key, value_a_); });
    if (op == "get") return timed([&](Client& c) { check_size(c.store->get(c.key)); });
    if (op == "add") return timed([&](Client& c) { c.store->add("counter", 1); });
    if (op == "check")
      return timed([&](Client& c) { expect(c.store->check({c.key}), "check() of a key that exists"); });
    if (op == "compare_set")
      return timed([&](Client& c) {
        const Bytes& expected = c.cas_flipped ? value_b_ : value_a_;
        const Bytes& desired = c.cas_flipped ? value_a_ : value_b_;
        expect(c.store->compareSet(c.cas_key, expected, desired) == desired, "compareSet() to swap");
        c.cas_flipped = !c.cas_flipped;
      });
    if (op == "wait") return timed([&](Client& c) { c.store->wait({c.key}, timeout_); });
#if COHORT_C10D_STORE_HAS_EXTENDED_API
    if (op == "multi_get")
      return timed([&](Client& c) {
        expect(c.store->multiGet(c.multi_keys).size() == c.multi_keys.size(), "multiGet() of keys that exist");
      });
#endif
    if (op == "broadcast") return broadcast(repeat);
    throw std::runtime_error("no operation " + op);
  }

 private:
  void check_size(const Bytes& value) const { expect(value.size() == value_a_.size(), "get() of a stored value"); }
  static void expect(bool ok, const char* what) {
    if (!ok) throw std::runtime_error(std::string(what) + " returned a wrong result");
  }

  const Args& args_;
  cohort::bench::ServerProcess& server_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  Bytes value_a_, value_b_;
  std::vector<Client> clients_;
  c10::intrusive_ptr<c10d::Store> setter_;
};

std::string random_token() {
  std::random_device device;
  return fmt::format("{:016x}{:016x}", (std::uint64_t{device()} << 32) | device(),
                     (std::uint64_t{device()} << 32) | device());
}

std::vector<std::string> operations() {
  std::vector<std::string> ops = {"set", "get", "add", "check", "compare_set", "wait"};
  if (COHORT_C10D_STORE_HAS_EXTENDED_API) ops.push_back("multi_get");
  ops.push_back("broadcast");
  return ops;
}

void report(const Args& args, const std::string& backend, const std::string& op, const PhaseResult& r, int repeats,
            const std::string& load) {
  auto round_to = [](double v, double per_unit) { return std::round(v * per_unit) / per_unit; };
  Json line;
  line["store"] = args.store;
  line["backend"] = backend;
  line["torch"] = cohort::compat::torch_version();
  line["clients"] = args.clients;
  const bool all_active = op == "connect" || op == "broadcast" || args.active <= 0;
  line["active"] = all_active ? args.clients : std::min(args.active, args.clients);
  line["op"] = op;
  line["ops_per_s"] = std::round(r.ops_per_s);
  line["p50_us"] = round_to(r.p50_us, 10);
  line["p99_us"] = round_to(r.p99_us, 10);
  line["server_cpu_us_per_op"] = round_to(r.server_cpu_us_per_op, 100);
  line["server_sys_us_per_op"] = round_to(r.server_sys_us_per_op, 100);
  line["client_cpu_us_per_op"] = round_to(r.client_cpu_us_per_op, 100);
  line["fewest_share"] = round_to(r.fewest_share, 1000);
  line["repeats"] = repeats;
  line["seconds"] = op == "connect" || op == "broadcast" ? 0.0 : args.seconds;
  line["server"] = "child process";
  line["loadavg"] = load;
  std::cout << line.dump() << std::endl;
  std::cerr << fmt::format("{:<8} {:<12} {:>5} {:<12} {:>9.0f} {:>10.1f} {:>10.1f} {:>9.2f} {:>9.2f} {:>6.2f}\n",
                           args.store, backend, args.clients, op, r.ops_per_s, r.p50_us, r.p99_us,
                           r.server_cpu_us_per_op, r.client_cpu_us_per_op, r.fewest_share);
}

int bench(const Args& args, const char* self) {
  raise_open_files_limit();
  const std::string token = random_token();
  ::setenv(kTokenVariable, token.c_str(), 1);
  cohort::bench::ServerProcess server(
      {self, "--serve", "--store", args.store, "--timeout-s", std::to_string(args.timeout_s)},
      std::chrono::seconds(args.timeout_s));
  const std::string load = load_average();
  Bench bench(args, server, token);
  std::cerr << fmt::format("{} ({}, LibTorch {}), {} clients, server in a child process; load average {}\n",
                           args.store, server.backend(), cohort::compat::torch_version(), args.clients, load);
  std::cerr << fmt::format("{:<8} {:<12} {:>5} {:<12} {:>9} {:>10} {:>10} {:>9} {:>9} {:>6}\n", "store", "backend",
                           "N", "op", "ops/s", "p50 us", "p99 us", "srv us/op", "cli us/op", "fewest");
  report(args, server.backend(), "connect", bench.connect_all(), 1, load);
  const auto ops = operations();
  std::vector<std::vector<PhaseResult>> runs(ops.size());
  for (int r = 0; r < args.repeats; ++r)  // interleaved, so drift in the machine's load spreads over every op
    for (std::size_t o = 0; o < ops.size(); ++o) runs[o].push_back(bench.run(ops[o], r));
  for (std::size_t o = 0; o < ops.size(); ++o)
    report(args, server.backend(), ops[o], cohort::bench::median_of(runs[o]), args.repeats, load);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app("cohort's store against c10d's TCPStore with N clients (docs/scale.md, \"The store\")");
  app.add_option("--store", a.store, "which server and clients")->check(CLI::IsMember({"cohort", "tcpstore"}));
  app.add_option("--clients", a.clients, "client connections, one thread each")->check(CLI::Range(1, 8192));
  app.add_option("--seconds", a.seconds, "length of each timed phase")->check(CLI::Range(0.01, 3600.0));
  app.add_option("--warmup-ops", a.warmup_ops, "untimed operations per client before each phase")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--repeats", a.repeats, "timed runs of each operation; the medians are reported")
      ->check(CLI::Range(1, 1000));
  app.add_option("--broadcast-rounds", a.broadcast_rounds, "set-releases-N-waiters rounds per repeat")
      ->check(CLI::Range(1, 1000));
  app.add_option("--active", a.active, "clients that run the timed phases, the others idle; 0: all")
      ->check(CLI::Range(0, 8192));
  app.add_option("--value-bytes", a.value_bytes, "bytes of each value")->check(CLI::Range(1, 1 << 20));
  app.add_option("--multi-keys", a.multi_keys, "keys per multiGet")->check(CLI::Range(1, 1024));
  app.add_option("--connect-parallel", a.connect_parallel, "clients connecting at once")->check(CLI::Range(1, 8192));
  app.add_option("--timeout-s", a.timeout_s, "bound on every wait")->check(CLI::Range(1, 3600));
  app.add_flag("--smoke", a.smoke, "a few operations, one repeat (also COHORT_BENCH_SMOKE=1)");
  app.add_flag("--serve", a.serve, "internal: be the server (Note [The --serve protocol])");
  CLI11_PARSE(app, argc, argv);
  if (const char* s = std::getenv("COHORT_BENCH_SMOKE"); s && std::string(s) == "1") a.smoke = true;
  if (a.smoke) {
    a.seconds = std::min(a.seconds, 0.2);
    a.warmup_ops = std::min(a.warmup_ops, 1);
    a.repeats = 1;
    a.broadcast_rounds = std::min(a.broadcast_rounds, 2);
  }
  try {
    if (a.serve) return serve(a);
    // /proc/self/exe: the child runs this very binary, wherever argv[0] points.
    return bench(a, "/proc/self/exe");
  } catch (const std::exception& e) {
    std::cerr << "scale_store_bench: " << e.what() << std::endl;
    return 1;
  }
}
