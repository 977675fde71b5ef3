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
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cohort/comm/world.h"
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

int run(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "";
  int target = argc > 2 ? std::atoi(argv[2]) : -1;
  auto env = cohort::comm::process_environment();
  auto info = cohort::comm::world_info_from(env);

  if (scenario == "sleep") {
    std::cout << "ready pid=" << getpid() << std::endl;
    wait_forever();
  }
  if (scenario == "env") {
    for (const char* name : {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
                             "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS"}) {
      auto it = env.find(name);
      std::cout << name << "=" << (it == env.end() ? "<unset>" : it->second) << std::endl;
    }
    return 0;
  }
  if (scenario == "chatter") {
    for (int i = 0; i < 200; ++i) std::cout << "line " << i << " from rank " << info.rank << " end" << std::endl;
    return 0;
  }
  if (scenario == "absent" && info.rank == target) wait_forever();

  auto world = World::init();
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
