// A worker program for the multi-process tests, started through `cohort run`.
// Usage: cohort_test_worker SCENARIO [RANK_ARG]
//   collectives       exact checks of every collective; prints "collectives ok ..."
//   subgroups         collectives on the even ranks' and odd ranks' sub-groups
//   throw K           rank K throws after joining; the others wait in a barrier
//   sigkill K         rank K kills itself with SIGKILL after joining
//   absent K          rank K never joins; the others time out joining
//   stall K           rank K joins but skips an all_reduce; the others time out in it
//   sleep             prints "ready pid=<pid>" and waits to be signalled
//   env               prints the launcher's environment contract
//   chatter           every rank prints 200 numbered lines as fast as it can
//   flood             every rank prints 4000 lines of 64 characters
//   flood_then_wait   floods as above, then creates $COHORT_TEST_MARKER_DIR/flooded.<rank>,
//                     waits (at most 120 s) for the file "go" there, prints "done" and exits
//   progress          prints a CRLF line, then a progress line ended by '\r' only
//   fds               prints the descriptors it inherited: "fds: 0 1 2"
//   late_store [S]    node 0's workers set a key in the job's store and exit; node 1's
//                     wait S seconds (default 4), then read the key from the store and
//                     print "late store ok at_ms=<wall clock>" (or "FAILED (why)", exit 1)
//   sleep_node K      node K's workers print "ready pid=<pid>" and wait to be signalled;
//                     the other nodes' exit at once
//   ft K D            for --fault-tolerance in-process: prints "ft start rank=R incarnation=I
//                     pid=P" and its environment ("ft env ..."); rank K kills itself with
//                     SIGKILL in incarnations below D; every other process waits (120 s at
//                     most) for the file $COHORT_TEST_MARKER_DIR/stop, reads rank K's death
//                     keys through its own store view (ranks other than K), prints
//                     "ft keys dead=<v> event1=<v>" and "ft exit rank=R incarnation=I pid=P",
//                     and exits 0
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cohort/comm/rendezvous.h"
#include "cohort/comm/world.h"
#include "cohort/compat/c10d.h"
#include "cohort/elastic/error_file.h"
#include "cohort/errors.h"

namespace {

using cohort::comm::ReduceOp;
using cohort::comm::World;

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

[[noreturn]] void wait_forever() {
  while (true) pause();
}

int collectives(const World& world) {
  auto& g = world.group();
  const int r = g.rank(), n = g.size();
  // all_reduce: sum, max, avg, on float64 and int64.
  auto t = torch::arange(4, torch::kFloat64) + r;
  g.all_reduce(t);
  auto expected = torch::arange(4, torch::kFloat64) * n + n * (n - 1) / 2.0;
  expect(torch::equal(t, expected), "all_reduce sum");
  auto m = torch::full({3}, static_cast<int64_t>(r), torch::kInt64);
  g.all_reduce(m, ReduceOp::kMax);
  expect(torch::equal(m, torch::full({3}, static_cast<int64_t>(n - 1), torch::kInt64)), "all_reduce max");
  auto a = torch::full({2}, static_cast<double>(r), torch::kFloat64);
  g.all_reduce(a, ReduceOp::kAvg);
  expect(torch::equal(a, torch::full({2}, (n - 1) / 2.0, torch::kFloat64)), "all_reduce avg");
  // broadcast from the last rank.
  auto b = r == n - 1 ? torch::tensor({7.0, 8.0, 9.0}) : torch::zeros({3});
  g.broadcast(b, n - 1);
  expect(torch::equal(b, torch::tensor({7.0, 8.0, 9.0})), "broadcast");
  // all_gather: rank i contributes [i, i*i].
  auto parts = g.all_gather(torch::tensor({static_cast<float>(r), static_cast<float>(r * r)}));
  expect(static_cast<int>(parts.size()) == n, "all_gather count");
  for (int i = 0; i < n; ++i)
    expect(torch::equal(parts[i], torch::tensor({static_cast<float>(i), static_cast<float>(i * i)})),
           "all_gather part " + std::to_string(i));
  // reduce_scatter: every rank holds 0..2n-1 (+r); chunk i sums to 2 values.
  auto in = torch::arange(2 * n, torch::kFloat64) + r;
  auto mine = g.reduce_scatter(in);
  auto want = torch::arange(2 * r, 2 * r + 2, torch::kFloat64) * n + n * (n - 1) / 2.0;
  expect(torch::equal(mine, want), "reduce_scatter");
  // send/recv around a ring.
  if (n > 1) {
    auto out = torch::full({5}, static_cast<float>(100 + r));
    auto got = torch::zeros({5});
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      g.send(out, next);
      g.recv(got, prev);
    } else {
      g.recv(got, prev);
      g.send(out, next);
    }
    expect(torch::equal(got, torch::full({5}, static_cast<float>(100 + prev))), "send/recv ring");
  }
  g.barrier();
  std::cout << "collectives ok rank " << r << " world " << n << " sum " << t[0].item<double>() << std::endl;
  return 0;
}

int subgroups(const World& world) {
  std::vector<int> even, odd;
  for (int i = 0; i < world.size(); ++i) (i % 2 ? odd : even).push_back(i);
  auto ge = world.new_group(even);
  auto go = world.new_group(odd);
  auto& mine = world.rank() % 2 ? go : ge;
  expect(!(world.rank() % 2 ? ge : go).is_member(), "membership");
  auto t = torch::full({1}, static_cast<double>(world.rank()));
  mine.all_reduce(t);
  double want = 0;
  for (int r : mine.global_ranks()) want += r;
  expect(t.item<double>() == want, "sub-group all_reduce");
  std::cout << "subgroup ok rank " << world.rank() << " group rank " << mine.rank() << " sum " << want << std::endl;
  world.group().barrier();
  return 0;
}

void print_fds() {
  DIR* dir = opendir("/proc/self/fd");
  expect(dir != nullptr, "opendir /proc/self/fd");
  std::vector<int> fds;
  while (dirent* e = readdir(dir))
    if (e->d_name[0] != '.' && std::atoi(e->d_name) != dirfd(dir)) fds.push_back(std::atoi(e->d_name));
  closedir(dir);
  std::sort(fds.begin(), fds.end());
  std::cout << "fds:";
  for (int fd : fds) std::cout << " " << fd;
  std::cout << std::endl;
}

int late_store(const cohort::comm::EnvMap& env, int delay_s) {
  const auto host = env.at("MASTER_ADDR");
  const auto port = static_cast<std::uint16_t>(std::stoi(env.at("MASTER_PORT")));
  const std::string key = "late_store/hello";
  if (env.at("GROUP_RANK") == "0") {
    auto store = cohort::compat::make_tcp_store(host, port, false, std::chrono::seconds(10));
    store->set(key, std::vector<uint8_t>{'h', 'i'});
    std::cout << "late store set" << std::endl;
    return 0;
  }
  // A deliberate gap, so that node 0's workers are long gone when this one reads.
  std::this_thread::sleep_for(std::chrono::seconds(delay_s));
  std::string outcome = "ok";
  try {
    auto store = cohort::compat::make_tcp_store(host, port, false, std::chrono::seconds(5));
    store->wait({key}, std::chrono::seconds(5));
    expect(store->get(key) == std::vector<uint8_t>{'h', 'i'}, "the key node 0's worker set");
  } catch (const std::exception& e) {
    outcome = std::string("FAILED (") + e.what() + ")";
  }
  // The last thing this worker does, so that the test can order node 0's exit after it.
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  std::cout << "late store " << outcome << " at_ms=" << now.count() << std::endl;
  return outcome == "ok" ? 0 : 1;
}

// Writes the marker file `name` into COHORT_TEST_MARKER_DIR, then waits (120 s at
// most) for the test's "go" file there.
int mark_then_wait_for_go(const cohort::comm::EnvMap& env, const std::string& name) {
  const std::string dir = env.at("COHORT_TEST_MARKER_DIR");
  std::ofstream(dir + "/" + name) << "marked\n";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::access((dir + "/go").c_str(), F_OK) != 0) {
    expect(std::chrono::steady_clock::now() < until, "the test's go file within 120 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cout << "done" << std::endl;
  return 0;
}

// The `ft` scenario (see the top of the file).
int fault_tolerance(const cohort::comm::EnvMap& env, const cohort::comm::WorldInfo& info, int target, int deaths) {
  const auto var = [&](const char* name) {
    auto it = env.find(name);
    return it == env.end() ? std::string("<unset>") : it->second;
  };
  const int incarnation = std::stoi(env.at("COHORT_FT_INCARNATION"));
  const auto me = "rank=" + std::to_string(info.rank) + " incarnation=" + std::to_string(incarnation) +
                  " pid=" + std::to_string(getpid());
  std::cout << "ft start " << me << std::endl;
  std::cout << "ft env rank=" << info.rank << " incarnation=" << incarnation << " RANK=" << var("RANK")
            << " LOCAL_RANK=" << var("LOCAL_RANK") << " MASTER_PORT=" << var("MASTER_PORT")
            << " COHORT_STORE_PREFIX=" << var("COHORT_STORE_PREFIX")
            << " COHORT_FAULT_TOLERANCE=" << var("COHORT_FAULT_TOLERANCE")
            << " COHORT_FT_MIN_REPLICAS=" << var("COHORT_FT_MIN_REPLICAS")
            << " TORCHELASTIC_RESTART_COUNT=" << var("TORCHELASTIC_RESTART_COUNT")
            << " TORCHELASTIC_ERROR_FILE=" << var("TORCHELASTIC_ERROR_FILE") << std::endl;
  if (info.rank == target && incarnation < deaths) raise(SIGKILL);
  const std::string stop = env.at("COHORT_TEST_MARKER_DIR") + "/stop";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::access(stop.c_str(), F_OK) != 0) {
    expect(std::chrono::steady_clock::now() < until, "the test's stop file within 120 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (target >= 0 && info.rank != target) {
    // The view a worker has of the job's store: PrefixStore(COHORT_STORE_PREFIX, client).
    auto store = cohort::comm::make_world_store(
        info, cohort::comm::InitOptions().join_timeout(std::chrono::seconds(10)));
    const std::string dead = "cohort/ft/dead/" + std::to_string(target), event = "cohort/ft/event/1";
    store->wait({dead, event}, std::chrono::seconds(10));
    auto text = [&](const std::string& key) {
      auto bytes = store->get(key);
      return std::string(bytes.begin(), bytes.end());
    };
    std::cout << "ft keys dead=" << text(dead) << " event1=" << text(event) << std::endl;
  }
  std::cout << "ft exit " << me << std::endl;
  return 0;
}

void write_raw(const std::string& text) {
  expect(::write(STDOUT_FILENO, text.data(), text.size()) == static_cast<ssize_t>(text.size()), "write");
}

int run(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "";
  int target = argc > 2 ? std::atoi(argv[2]) : -1;
  auto env = cohort::comm::process_environment();
  auto info = cohort::comm::world_info_from(env);

  if (scenario == "fds") {
    print_fds();
    return 0;
  }
  if (scenario == "sleep_node" && env.at("GROUP_RANK") != std::to_string(target)) return 0;
  if (scenario == "sleep" || scenario == "sleep_node") {
    std::cout << "ready pid=" << getpid() << std::endl;
    wait_forever();
  }
  if (scenario == "env") {
    for (const char* name : {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
                             "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
                             "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "COHORT_AGENT_STORE",
                             "COHORT_STORE_PREFIX", "COHORT_RDZV_TOKEN", "COHORT_CONSOLE_TTY"}) {
      auto it = env.find(name);
      std::cout << name << "=" << (it == env.end() ? "<unset>" : it->second) << std::endl;
    }
    return 0;
  }
  if (scenario == "chatter") {
    for (int i = 0; i < 200; ++i) std::cout << "line " << i << " from rank " << info.rank << " end" << std::endl;
    return 0;
  }
  if (scenario == "flood" || scenario == "flood_then_wait") {
    const std::string filler(40, 'x');
    for (int i = 0; i < 4000; ++i) std::cout << "flood " << i << " rank " << info.rank << " " << filler << "\n";
    std::cout << std::flush;
    if (scenario == "flood") return 0;
    return mark_then_wait_for_go(env, "flooded." + std::to_string(info.rank));
  }
  if (scenario == "progress") {
    write_raw("crlf line\r\n");
    write_raw("50%\r");
    write_raw("100%\r");
    return 0;
  }
  if (scenario == "late_store") return late_store(env, target > 0 ? target : 4);
  if (scenario == "ft") return fault_tolerance(env, info, target, argc > 3 ? std::atoi(argv[3]) : 1);
  if (scenario == "absent" && info.rank == target) wait_forever();

  auto world = World::init();
  if (scenario == "joined_then_wait") return mark_then_wait_for_go(env, "joined." + std::to_string(info.rank));
  if (scenario == "collectives") return collectives(world);
  if (scenario == "subgroups") return subgroups(world);
  if (scenario == "throw") {
    if (world.rank() == target) throw std::runtime_error("boom from rank " + std::to_string(target));
    world.group().barrier();
    return 0;
  }
  if (scenario == "sigkill") {
    if (world.rank() == target) raise(SIGKILL);
    world.group().barrier();
    return 0;
  }
  if (scenario == "mismatch") {
    // Rank `target` all-reduces 21 floats, the others 1: Gloo aborts a receiver
    // from its transport thread (Note [Exceptions no caller can catch]).
    auto t = torch::ones({world.rank() == target ? 21 : 1});
    world.group().all_reduce(t);
    return 0;
  }
  if (scenario == "stall") {
    world.group().barrier();
    if (world.rank() == target) wait_forever();
    auto t = torch::ones({1});
    world.group().all_reduce(t);
    return 0;
  }
  throw std::invalid_argument("unknown scenario '" + scenario + "'");
}

}  // namespace

int main(int argc, char** argv) {
  return cohort::elastic::record([&] { return run(argc, argv); });
}
