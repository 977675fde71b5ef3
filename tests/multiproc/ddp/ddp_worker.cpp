// One DDP scenario per run, started by tests/multiproc/ddp_test.cpp through
// `cohort run`. Every rank trains with DDP on its slice of each global batch and,
// in the same process, replays the single-process reference on the whole batch;
// it prints "<scenario> ok ..." when they agree and exits 1 otherwise.
//   ddp_worker parity|no_sync|hook|join|failed_step|mismatch|unused_error|device [flags]
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "ddp/checks.h"
#include "ddp/models.h"

namespace {
using namespace cohort::testing;
using cohort::comm::World;
using cohort::ddp::DistributedDataParallel;

int parity(const WorkerArgs& a, World& world) {
  if (a.model == "mlp") return run_parity(a, world, [] { return make_mlp(); }, plain_forward());
  if (a.model == "shared") return run_parity(a, world, [] { return SharedNet(); }, plain_forward());
  if (a.model == "unused")
    return run_parity(a, world, [] { return PartlyUsedNet(); },
                      [](auto& call, const torch::Tensor& x, int step) { return call(x, step % 2 == 1); });
  if (a.model == "unused_static")  // the same parameter unused in every step
    return run_parity(a, world, [] { return PartlyUsedNet(); },
                      [](auto& call, const torch::Tensor& x, int) { return call(x, true); });
  if (a.model == "cnn_syncbn") return run_cnn_parity(a, world);
  throw std::invalid_argument("unknown model " + a.model);
}

// Prints the error DDP raised; a run where it raised none fails.
template <typename Body>
int expect_config_error(World& world, const char* scenario, Body body) {
  try {
    body();
  } catch (const cohort::ConfigError& e) {
    std::cout << scenario << " ok rank " << world.rank() << " caught: " << e.what() << std::endl;
    return 0;
  }
  std::cout << scenario << " FAILED rank " << world.rank() << ": no error was raised" << std::endl;
  return 1;
}

int mismatch(World& world) {
  return expect_config_error(world, "mismatch", [&] {
    auto model = world.rank() == 1 ? torch::nn::Sequential(torch::nn::Linear(20, 32), torch::nn::Linear(32, 5))
                                   : torch::nn::Sequential(torch::nn::Linear(20, 32), torch::nn::Linear(32, 4));
    DistributedDataParallel ddp(model, world.group());
  });
}

int unused_error(World& world) {
  return expect_config_error(world, "unused_error", [&] {
    DistributedDataParallel ddp(PartlyUsedNet(), world.group());
    ddp(torch::randn({4, 20}), true).sum().backward();
  });
}

int wrong_device(World& world) {
  return expect_config_error(world, "device", [&] {
    DistributedDataParallel ddp(make_mlp(), world.group());
    ddp(torch::empty({4, 20}, torch::kMeta));
  });
}

}  // namespace

int main(int argc, char** argv) {
  auto args = parse_worker_args(argc, argv);
  torch::set_num_threads(1);
  auto world = World::init();
  if (args.scenario == "parity") return parity(args, world);
  if (args.scenario == "no_sync") return run_no_sync(args, world);
  if (args.scenario == "hook") return run_hook(args, world);
  if (args.scenario == "join") return run_join(args, world);
  if (args.scenario == "failed_step") return run_failed_step(args, world);
  if (args.scenario == "mismatch") return mismatch(world);
  if (args.scenario == "unused_error") return unused_error(world);
  if (args.scenario == "device") return wrong_device(world);
  std::cerr << "unknown scenario '" << args.scenario << "'\n";
  return 2;
}
