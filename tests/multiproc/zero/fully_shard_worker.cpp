// ZeRO-3 across real processes, started by tests/multiproc/fully_shard_test.cpp
// through `cohort run`. Every rank trains two copies of one model on its rows of
// each global batch: one under DDP with a plain optimizer, one fully sharded
// (cohort::zero::fully_shard) with FullyShardedOptimizer around the same optimizer.
// Each scenario prints "<scenario> ok rank R ..." when they agree, and exits 1
// otherwise.
//   fully_shard_worker parity --optimizer sgd|adam [--steps K] [--reshard 0|1] [--dir CKPT]
//   fully_shard_worker resume --optimizer sgd|adam --dir CKPT [--steps K]
//   fully_shard_worker mismatch
// parity with --dir saves a checkpoint of the sharded copy after K steps; resume
// loads it, at any world size, into a sharded copy and (as DDP's own checkpoint) into
// the DDP copy, and trains both K more steps.
#include <torch/torch.h>

#include <iostream>
#include <optional>
#include <string>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/zero/fully_sharded_optimizer.h"
#include "cohort/zero/state_bytes.h"
#include "zero/optimizers.h"

namespace {
using cohort::comm::World;
using cohort::zero::FullyShard;

struct Args {
  std::string scenario;
  std::string optimizer = "adam";
  int steps = 4;
  bool reshard = true;
  std::string dir;
};

// The reductions add the ranks' values in another order than DDP's buckets do:
// float rounding (about 1e-7 here); a lost or doubled gradient moves a weight by 1e-3.
constexpr double kTolerance = 1e-5;

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) throw std::invalid_argument("usage: fully_shard_worker SCENARIO [flags]");
  a.scenario = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--optimizer") a.optimizer = value();
    else if (flag == "--steps") a.steps = std::stoi(value());
    else if (flag == "--reshard") a.reshard = value() == "1";
    else if (flag == "--dir") a.dir = value();
    else throw std::invalid_argument("unknown flag " + flag);
  }
  return a;
}

// x * gain, where two of these share one gain.
struct GainImpl : torch::nn::Module {
  explicit GainImpl(torch::Tensor g) { gain = register_parameter("gain", std::move(g)); }
  torch::Tensor forward(const torch::Tensor& x) { return x * gain; }
  torch::Tensor gain;
};
TORCH_MODULE(Gain);

// Uneven sizes (no even split over 3 ranks), layer c used twice, a gain shared by
// two units (so it belongs to the outer one), and a frozen parameter.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool units) {
    torch::nn::Linear la(20, 48), lb(48, 30), lc(30, 30);
    auto gain = torch::ones({30}) + 0.1 * torch::randn({30});
    Gain g1(gain), g2(gain);
    head = register_module("head", torch::nn::Linear(30, 4));
    frozen = register_parameter("frozen", torch::randn({30}) * 0.1, /*requires_grad=*/false);
    if (units) {
      ua = register_module("a", FullyShard<torch::nn::LinearImpl>(la));
      ub = register_module("b", FullyShard<torch::nn::LinearImpl>(lb));
      uc = register_module("c", FullyShard<torch::nn::LinearImpl>(lc));
      ug1 = register_module("g1", FullyShard<GainImpl>(g1));
      ug2 = register_module("g2", FullyShard<GainImpl>(g2));
    } else {
      a = register_module("a", la);
      b = register_module("b", lb);
      c = register_module("c", lc);
      pg1 = register_module("g1", g1);
      pg2 = register_module("g2", g2);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const bool u = static_cast<bool>(ua);
    auto h = torch::relu(u ? ua(x) : a(x));
    h = torch::tanh(u ? ub(h) : b(h));
    h = u ? ug1(h) : pg1(h);
    h = torch::tanh((u ? uc(h) : c(h)) + frozen);
    h = torch::tanh(u ? uc(h) : c(h));
    h = u ? ug2(h) : pg2(h);
    return head(h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, head{nullptr};
  Gain pg1{nullptr}, pg2{nullptr};
  FullyShard<torch::nn::LinearImpl> ua{nullptr}, ub{nullptr}, uc{nullptr};
  FullyShard<GainImpl> ug1{nullptr}, ug2{nullptr};
  torch::Tensor frozen;
};

cohort::zero::OptimizerFactory factory(const std::string& name) { return cohort::testing::zero_test_optimizer(name); }

using cohort::testing::unique_params;

constexpr int kRows = 5;
std::pair<torch::Tensor, torch::Tensor> rows(int step, int rank, int world) {
  torch::manual_seed(3000 + step);
  auto x = torch::randn({world * kRows, 20});
  auto y = torch::randn({world * kRows, 4});
  return {x.narrow(0, rank * kRows, kRows), y.narrow(0, rank * kRows, kRows)};
}

std::shared_ptr<NetImpl> make(bool units) {
  torch::manual_seed(7);
  return std::make_shared<NetImpl>(units);
}

struct Pair {
  Pair(World& world, const Args& a)
      : plain_model(make(false)),
        root(make(true)),
        plain(plain_model, world.group()),
        plain_opt(factory(a.optimizer)(unique_params(*plain_model))),
        sharded(cohort::zero::fully_shard(root, world.group(),
                                          cohort::zero::FullyShardOptions().reshard_after_forward(a.reshard))),
        sharded_opt(sharded, factory(a.optimizer)) {}
  void step(int s, World& world) {
    auto [x, y] = rows(s, world.rank(), world.size());
    plain_opt->zero_grad();
    sharded_opt.zero_grad();
    torch::mse_loss(plain(x), y).backward();
    torch::mse_loss(root(x), y).backward();
    plain_opt->step();
    sharded_opt.step();
  }
  std::shared_ptr<NetImpl> plain_model;
  FullyShard<NetImpl> root;
  cohort::ddp::DistributedDataParallel<std::shared_ptr<NetImpl>> plain;
  std::unique_ptr<torch::optim::Optimizer> plain_opt;
  cohort::zero::FullyShardedModel sharded;
  cohort::zero::FullyShardedOptimizer sharded_opt;
};

int report(World& world, const std::string& scenario, bool ok, const std::string& detail) {
  std::cout << scenario << (ok ? " ok" : " FAILED") << " rank " << world.rank() << ": " << detail << std::endl;
  return ok ? 0 : 1;
}

// Every parameter (the frozen one too) of the sharded copy within kTolerance of DDP's.
bool same_weights(Pair& pair, std::string& what) {
  auto full = pair.sharded.full_parameters();
  auto mine = pair.root->named_parameters();
  for (const auto& p : pair.plain_model->named_parameters()) {
    const double d = (mine[p.key()] - p.value()).abs().max().item<double>();
    if (!(d <= kTolerance)) {
      what = p.key() + " differs by " + std::to_string(d);
      return false;
    }
  }
  return true;
}

std::int64_t summed(World& world, std::int64_t mine) {
  auto t = torch::tensor({mine}, torch::kLong);
  world.group().all_reduce(t);
  return t.item<std::int64_t>();
}

// K steps; then the weights agree with DDP's, and each rank holds 1/N of the
// parameters, of the gradients and of the optimizer state (plus padding: at most
// N - 1 elements per flat parameter).
int parity(World& world, const Args& a) {
  Pair pair(world, a);
  for (int s = 0; s < a.steps; ++s) pair.step(s, world);
  std::string what;
  if (!same_weights(pair, what)) return report(world, "parity", false, what);

  std::int64_t whole = 0, trainable = 0;
  for (const auto& p : unique_params(*pair.plain_model)) {
    whole += static_cast<std::int64_t>(p.nbytes());
    if (p.requires_grad()) trainable += static_cast<std::int64_t>(p.nbytes());
  }
  const auto flats = static_cast<std::int64_t>(pair.sharded.schedule().flats().size());
  const std::int64_t padding = flats * (world.size() - 1) * 4;
  const auto params = pair.sharded.local_parameter_bytes();
  const auto grads = pair.sharded.local_gradient_bytes();
  const auto state = pair.sharded_opt.local_state_bytes();
  const auto whole_state = cohort::zero::optimizer_state_bytes(*pair.plain_opt);
  const std::int64_t n = world.size();
  const auto detail = "parameter bytes " + std::to_string(params) + " of " + std::to_string(whole) +
                      ", gradient bytes " + std::to_string(grads) + " of " + std::to_string(trainable) +
                      ", state bytes " + std::to_string(state) + " of " + std::to_string(whole_state);
  const std::int64_t per_element_state = a.optimizer == "sgd" ? 1 : 2;
  if (params > whole / n + padding || summed(world, params) < whole || grads > trainable / n + padding ||
      summed(world, grads) < trainable || state > whole_state / n + per_element_state * padding ||
      summed(world, state) < whole_state)
    return report(world, "parity", false, detail);

  if (!a.dir.empty()) {
    cohort::checkpoint::Checkpointer ckpt(a.dir, world.group());
    cohort::checkpoint::TrainingProgress progress;
    progress.step = a.steps;
    auto full = pair.sharded.full_parameters();
    ckpt.save(*pair.root, pair.sharded_opt, progress, torch::kCPU);
  }
  return report(world, "parity", true, detail);
}

// The checkpoint (saved by `parity`, maybe at another world size) into both copies:
// the sharded one and, as any whole checkpoint, the DDP one; K more steps agree.
int resume(World& world, const Args& a) {
  Pair pair(world, a);
  cohort::checkpoint::Checkpointer ckpt(a.dir, world.group());
  std::optional<cohort::checkpoint::Restored> sharded_restored;
  {
    auto full = pair.sharded.full_parameters(/*write_back=*/true);
    sharded_restored = ckpt.load_latest(*pair.root, pair.sharded_opt, torch::kCPU);
  }
  auto plain_restored = ckpt.load_latest(*pair.plain_model, *pair.plain_opt, torch::kCPU);
  if (!sharded_restored || !plain_restored) return report(world, "resume", false, "no checkpoint in " + a.dir);
  for (int s = 0; s < a.steps; ++s) pair.step(a.steps + s, world);
  std::string what;
  if (!same_weights(pair, what)) return report(world, "resume", false, what);
  return report(world, "resume", true, "step " + std::to_string(sharded_restored->progress.step));
}

// Rank 1 asks for other options: every rank refuses, naming them, and none hangs.
int mismatch(World& world, const Args&) {
  auto root = FullyShard<NetImpl>(make(true));
  try {
    cohort::zero::fully_shard(root, world.group(),
                              cohort::zero::FullyShardOptions().reshard_after_forward(world.rank() != 1));
  } catch (const cohort::ConfigError& e) {
    const std::string message = e.what();
    return report(world, "mismatch", message.find("FullyShardOptions") != std::string::npos, message);
  }
  return report(world, "mismatch", false, "accepted");
}

}  // namespace

int main(int argc, char** argv) {
  auto args = parse(argc, argv);
  torch::set_num_threads(1);
  auto world = World::init();
  if (args.scenario == "parity") return parity(world, args);
  if (args.scenario == "resume") return resume(world, args);
  if (args.scenario == "mismatch") return mismatch(world, args);
  std::cerr << "unknown scenario " << args.scenario << std::endl;
  return 2;
}
