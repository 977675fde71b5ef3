// ZeRO-1 across real processes, started by tests/multiproc/zero_test.cpp through
// `cohort run`. Every rank trains two copies of one model with DDP on its rows of
// each global batch: one with a plain optimizer, one with zero::ShardedOptimizer
// around the same optimizer. Note [ZeRO-1 step] says they must stay bitwise equal;
// each scenario prints "<scenario> ok rank R ..." when they do, and exits 1 otherwise.
//   zero_worker parity|resume|amp|mismatch|accumulate --optimizer sgd|adam [--steps K]
//     [--cap BYTES] [--file PATH] [--save] [--stage 1|2]
//   zero_worker writer --file DIR   (sharded saves in a loop until killed)
// With --stage 2 the sharded copy is not under DDP: ShardedOptimizer's
// shard_gradients reduces each gradient to its owner (Note [ZeRO-2 gradients]), and
// the copies agree within float rounding (kStageTwoTolerance), since a reduce may
// add the ranks' values in another order than DDP's all-reduce.
#include <torch/torch.h>

#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <iostream>
#include <string>

#include <unistd.h>

#include "cohort/amp/grad_scaler.h"
#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/world.h"
#include "cohort/compat/optimizer.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/zero/sharded_optimizer.h"
#include "cohort/zero/state_bytes.h"
#include "zero/optimizers.h"
#include "zero/sharded_writer.h"

namespace {
using cohort::comm::World;
using cohort::ddp::DistributedDataParallel;
using cohort::zero::ShardedOptimizer;

struct Args {
  std::string scenario;
  std::string optimizer = "adam";
  int steps = 4;
  std::int64_t cap = 25 << 20;
  std::string file;
  bool save = false;
  int stage = 1;
};

// Stage 2 against DDP: a different order of summation moves a weight by float
// rounding (about 1e-7 here); a wrong average (a missing or double division, a
// rank's gradient lost) moves it by 1e-3 or more.
constexpr double kStageTwoTolerance = 1e-5;

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) throw std::invalid_argument("usage: zero_worker SCENARIO [flags]");
  a.scenario = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--optimizer") a.optimizer = value();
    else if (flag == "--steps") a.steps = std::stoi(value());
    else if (flag == "--cap") a.cap = std::stoll(value());
    else if (flag == "--file") a.file = value();
    else if (flag == "--save") a.save = true;
    else if (flag == "--stage") a.stage = std::stoi(value());
    else throw std::invalid_argument("unknown flag " + flag);
  }
  return a;
}

// Parameters of uneven sizes (a partition over 3 ranks cannot be even), one of them
// shared by two layers and one frozen.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", torch::nn::Linear(20, 48));
    b = register_module("b", torch::nn::Linear(48, 30));
    c = register_module("c", torch::nn::Linear(30, 30));
    head = register_module("head", torch::nn::Linear(30, 4));
    frozen = register_parameter("frozen", torch::randn({30}) * 0.1, /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(b(torch::relu(a(x))));
    h = torch::tanh(c(h) + frozen);
    h = torch::tanh(c(h));  // c twice: its parameters get two contributions
    return head(h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, head{nullptr};
  torch::Tensor frozen;
};
TORCH_MODULE(Net);

cohort::zero::OptimizerFactory factory(const std::string& name) { return cohort::testing::zero_test_optimizer(name); }

struct Batch {
  torch::Tensor x, y;
};
constexpr int kRows = 5;
Batch rows(int step, int rank, int world) {
  torch::manual_seed(2000 + step);
  auto x = torch::randn({world * kRows, 20});
  auto y = torch::randn({world * kRows, 4});
  return {x.narrow(0, rank * kRows, kRows), y.narrow(0, rank * kRows, kRows)};
}

// Two copies of the model: `plain` under DDP with the whole optimizer, `sharded`
// with ShardedOptimizer, under DDP at stage 1 and alone at stage 2.
struct Pair {
  Pair(World& world, const Args& a)
      : stage(a.stage), plain_model(make()), sharded_model(make()), plain(plain_model, world.group()),
        plain_opt(factory(a.optimizer)(plain_model->parameters())),
        sharded_opt(sharded_model->parameters(), world.group(), factory(a.optimizer),
                    cohort::zero::ShardedOptimizerOptions().bucket_cap_bytes(a.cap).shard_gradients(a.stage == 2)) {
    if (stage == 1) sharded.emplace(sharded_model, world.group());
  }
  static Net make() {
    torch::manual_seed(7);
    return Net();
  }
  torch::Tensor sharded_forward(const torch::Tensor& x) { return sharded ? (*sharded)(x) : sharded_model(x); }
  void step(int step, World& world, cohort::amp::GradScaler* plain_scaler = nullptr,
            cohort::amp::GradScaler* sharded_scaler = nullptr, bool poison = false) {
    auto b = rows(step, world.rank(), world.size());
    plain_opt->zero_grad();
    sharded_opt.zero_grad();
    auto l1 = torch::mse_loss(plain(b.x), b.y);
    auto l2 = torch::mse_loss(sharded_forward(b.x), b.y);
    if (plain_scaler) {
      plain_scaler->scale(l1).backward();
      sharded_scaler->scale(l2).backward();
      if (poison) {  // one rank's gradient overflows: every rank must skip
        plain_model->head->bias.grad()[0] = std::numeric_limits<float>::infinity();
        // At stage 2 this rank holds the gradients of its own parameters only.
        for (auto& p : sharded_model->parameters())
          if (p.grad().defined()) {
            p.grad().view(-1)[0] = std::numeric_limits<float>::infinity();
            break;
          }
      }
      plain_scaler->step(*plain_opt);
      sharded_scaler->step(sharded_opt);
      plain_scaler->update();
      sharded_scaler->update();
      return;
    }
    l1.backward();
    l2.backward();
    plain_opt->step();
    sharded_opt.step();
  }
  int stage;
  Net plain_model, sharded_model;
  DistributedDataParallel<Net> plain;
  std::optional<DistributedDataParallel<Net>> sharded;
  std::unique_ptr<torch::optim::Optimizer> plain_opt;
  ShardedOptimizer sharded_opt;
};

// Bitwise equal with tolerance 0, else within it elementwise.
bool near(const torch::Tensor& x, const torch::Tensor& y, double tolerance) {
  if (tolerance == 0) return torch::equal(x, y);
  return x.sizes() == y.sizes() && (x - y).abs().max().item<double>() <= tolerance;
}

// Parameters (and the frozen one) bitwise equal, or within `tolerance`.
bool same_weights(const torch::nn::Module& x, const torch::nn::Module& y, std::string& what, double tolerance = 0) {
  auto px = x.named_parameters(), py = y.named_parameters();
  for (const auto& item : px) {
    if (!near(item.value(), py[item.key()], tolerance)) {
      what = item.key() + " differs by " +
             std::to_string((item.value() - py[item.key()]).abs().max().item<double>());
      return false;
    }
  }
  return true;
}

// Per-parameter states of two optimizers over identically ordered parameters.
bool same_states(const torch::optim::Optimizer& x, const std::vector<torch::Tensor>& px,
                 const torch::optim::Optimizer& y, const std::vector<torch::Tensor>& py, std::string& what,
                 double tolerance = 0) {
  using namespace torch::optim;
  auto state_of = [](const Optimizer& o, const torch::Tensor& p) -> const OptimizerParamState* {
    auto it = o.state().find(cohort::compat::optimizer_state_key(p));
    return it == o.state().end() ? nullptr : it->second.get();
  };
  for (std::size_t i = 0; i < px.size(); ++i) {
    const auto* sx = state_of(x, px[i]);
    const auto* sy = state_of(y, py[i]);
    if ((sx == nullptr) != (sy == nullptr)) {
      what = "parameter " + std::to_string(i) + " has state in only one";
      return false;
    }
    if (sx == nullptr) continue;
    bool same = false;
    if (auto* a = dynamic_cast<const AdamParamState*>(sx)) {
      auto* b = dynamic_cast<const AdamParamState*>(sy);
      same = b && a->step() == b->step() && near(a->exp_avg(), b->exp_avg(), tolerance) &&
             near(a->exp_avg_sq(), b->exp_avg_sq(), tolerance);
    } else if (auto* a = dynamic_cast<const AdamWParamState*>(sx)) {
      auto* b = dynamic_cast<const AdamWParamState*>(sy);
      same = b && a->step() == b->step() && near(a->exp_avg(), b->exp_avg(), tolerance) &&
             near(a->exp_avg_sq(), b->exp_avg_sq(), tolerance);
    } else if (auto* a = dynamic_cast<const SGDParamState*>(sx)) {
      auto* b = dynamic_cast<const SGDParamState*>(sy);
      same = b && near(a->momentum_buffer(), b->momentum_buffer(), tolerance);
    }
    if (!same) {
      what = "the state of parameter " + std::to_string(i) + " differs";
      return false;
    }
  }
  return true;
}

int report(World& world, const std::string& scenario, bool ok, const std::string& detail) {
  std::cout << scenario << (ok ? " ok" : " FAILED") << " rank " << world.rank() << ": " << detail << std::endl;
  return ok ? 0 : 1;
}

using cohort::testing::unique_params;

// K steps, then: weights bitwise equal on every rank; the shards' state bytes add up
// to the whole optimizer's, each about 1/N of it; and the state gathered to rank 0
// and saved loads into a plain optimizer equal to the whole one.
// At stage 2 also: each rank holds only its own parameters' gradients, and they add
// up to every trainable parameter's once.
int parity(World& world, const Args& a) {
  Pair pair(world, a);
  for (int s = 0; s < a.steps; ++s) pair.step(s, world);
  std::string what;
  const double tolerance = a.stage == 2 ? kStageTwoTolerance : 0;
  if (!same_weights(*pair.plain_model, *pair.sharded_model, what, tolerance))
    return report(world, "parity", false, what);
  if (a.stage == 2) {
    std::int64_t trainable = 0;
    for (const auto& p : unique_params(*pair.sharded_model))
      if (p.requires_grad()) trainable += static_cast<std::int64_t>(p.nbytes());
    const auto held = pair.sharded_opt.gradient_sharder()->local_gradient_bytes();
    auto sum = torch::tensor({held}, torch::kLong);
    world.group().all_reduce(sum);
    std::int64_t own = 0;
    for (const auto& p : pair.sharded_opt.shard())
      if (p.requires_grad()) own += static_cast<std::int64_t>(p.nbytes());
    if (sum.item<std::int64_t>() != trainable || held != own)
      return report(world, "parity", false,
                    "gradient bytes: held " + std::to_string(held) + ", own parameters " + std::to_string(own) +
                        ", sum " + std::to_string(sum.item<std::int64_t>()) + ", trainable " +
                        std::to_string(trainable));
  }

  const auto whole_bytes = cohort::zero::optimizer_state_bytes(*pair.plain_opt);
  const auto mine = pair.sharded_opt.local_state_bytes();
  auto total = torch::tensor({mine}, torch::kLong);
  world.group().all_reduce(total);
  std::int64_t largest = 0;
  for (const auto& p : pair.plain_model->parameters())
    if (p.requires_grad()) largest = std::max<std::int64_t>(largest, p.numel() * p.element_size());
  const std::int64_t per_param_state = a.optimizer == "sgd" ? 1 : 2;  // momentum; or Adam's two moments
  const std::int64_t bound = whole_bytes / world.size() + per_param_state * largest;
  if (total.item<std::int64_t>() != whole_bytes || mine > bound)
    return report(world, "parity", false,
                  "state bytes: mine " + std::to_string(mine) + ", sum " + std::to_string(total.item<std::int64_t>()) +
                      ", whole " + std::to_string(whole_bytes) + ", bound " + std::to_string(bound));

  pair.sharded_opt.gather_state(0);
  bool gathered_ok = true;
  if (world.rank() == 0) {
    torch::serialize::OutputArchive out;
    pair.sharded_opt.save(out);
    std::ostringstream bytes;
    out.save_to(bytes);
    if (a.save) std::ofstream(a.file, std::ios::binary) << bytes.str();
    // Into a plain optimizer over a third copy of the model.
    torch::manual_seed(7);
    Net third;
    auto plain = factory(a.optimizer)(third->parameters());
    torch::serialize::InputArchive in;
    const auto text = bytes.str();
    in.load_from(text.data(), text.size());
    plain->load(in);
    gathered_ok = same_states(*plain, unique_params(*third), *pair.plain_opt, unique_params(*pair.plain_model), what,
                              tolerance);
  }
  pair.sharded_opt.release_gathered_state();
  world.group().barrier();
  if (!gathered_ok) return report(world, "parity", false, "gathered state: " + what);
  return report(world, "parity", true,
                a.optimizer + " state bytes " + std::to_string(mine) + " of " + std::to_string(whole_bytes));
}

// Resumes from a whole state that a run of another world size gathered and saved
// (parity --save): both copies start from the same weights and load the file, the
// shards' states must add up to the whole one, and K more steps must stay bitwise
// equal (Adam's step counts and moments, SGD's momentum, all decide the updates).
int resume(World& world, const Args& a) {
  Pair pair(world, a);
  std::ifstream file(a.file, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.empty()) return report(world, "resume", false, "no state in " + a.file);
  for (auto* o : std::initializer_list<torch::optim::Optimizer*>{pair.plain_opt.get(), &pair.sharded_opt}) {
    torch::serialize::InputArchive in;
    in.load_from(text.data(), text.size());
    o->load(in);
  }
  const auto whole_bytes = cohort::zero::optimizer_state_bytes(*pair.plain_opt);
  auto total = torch::tensor({pair.sharded_opt.local_state_bytes()}, torch::kLong);
  world.group().all_reduce(total);
  if (whole_bytes == 0 || total.item<std::int64_t>() != whole_bytes)
    return report(world, "resume", false,
                  "loaded state bytes " + std::to_string(total.item<std::int64_t>()) + " of " +
                      std::to_string(whole_bytes));
  for (int s = 0; s < a.steps; ++s) pair.step(100 + s, world);
  std::string what;
  if (!same_weights(*pair.plain_model, *pair.sharded_model, what, a.stage == 2 ? kStageTwoTolerance : 0))
    return report(world, "resume", false, what);
  return report(world, "resume", true, "continued " + std::to_string(a.steps) + " steps from " + a.file);
}

// With a GradScaler each: one rank's overflow in step 2 makes every rank skip it.
int amp(World& world, const Args& a) {
  Pair pair(world, a);
  auto options = cohort::amp::GradScalerOptions().init_scale(1024).growth_interval(2);
  cohort::amp::GradScaler plain_scaler(options, world.group()), sharded_scaler(options, world.group());
  for (int s = 0; s < a.steps; ++s)
    pair.step(s, world, &plain_scaler, &sharded_scaler, s == 2 && world.rank() == world.size() - 1);
  std::string what;
  bool ok = same_weights(*pair.plain_model, *pair.sharded_model, what, a.stage == 2 ? kStageTwoTolerance : 0);
  ok = ok && plain_scaler.get_scale() == sharded_scaler.get_scale() && sharded_scaler.get_scale() < 1024 * 4;
  return report(world, "amp", ok, ok ? "scale " + std::to_string(sharded_scaler.get_scale()) : what);
}

// Stage 2's gradient accumulation against DDP's: per step, two micro-batches under
// no_sync, a third synchronised; then a synchronised backward twice before one
// step (each adds its average, as under DDP).
int accumulate(World& world, const Args& a) {
  Pair pair(world, a);
  auto backward_both = [&](int step, int micro) {
    auto b = rows(step * 10 + micro, world.rank(), world.size());
    torch::mse_loss(pair.plain(b.x), b.y).backward();
    torch::mse_loss(pair.sharded_forward(b.x), b.y).backward();
  };
  for (int s = 0; s < a.steps; ++s) {
    pair.plain_opt->zero_grad();
    pair.sharded_opt.zero_grad();
    {
      auto plain_guard = pair.plain.no_sync();
      auto sharded_guard = pair.sharded_opt.no_sync();
      backward_both(s, 0);
      backward_both(s, 1);
    }
    backward_both(s, 2);
    if (s == a.steps - 1) backward_both(s, 3);  // a second synchronised backward adds on
    pair.plain_opt->step();
    pair.sharded_opt.step();
  }
  std::string what;
  const bool ok = same_weights(*pair.plain_model, *pair.sharded_model, what, kStageTwoTolerance);
  return report(world, "accumulate", ok, ok ? "equal to DDP's no_sync within float rounding" : what);
}

// Rank 1 asks for another bucket size (--file cap), another learning rate (--file
// lr), no factory at all (--file factory) or stage 2 alone (--file stage): every rank
// refuses, none hangs.
int mismatch(World& world, const Args& a) {
  torch::manual_seed(7);
  Net model;
  const bool odd = world.rank() == 1;
  auto make = factory(a.optimizer);
  if (odd && a.file == "lr")
    make = [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.5));
    };
  if (odd && a.file == "factory") make = nullptr;
  try {
    ShardedOptimizer opt(model->parameters(), world.group(), make,
                         cohort::zero::ShardedOptimizerOptions()
                             .bucket_cap_bytes(odd && a.file == "cap" ? 1000 : 2000)
                             .shard_gradients(odd && a.file == "stage"));
  } catch (const cohort::ConfigError& e) {
    return report(world, "mismatch", true, std::string("caught: ") + e.what());
  }
  return report(world, "mismatch", false, "no error was raised");
}

// Saves sharded checkpoints in a loop until killed (the kill -9 test): step s holds
// weights and moments all equal to s (zero/sharded_writer.h). Resumes after the
// newest good checkpoint. Rank 0 prints "saved N" once N is durable.
int writer(World& world, const Args& a) {
  torch::manual_seed(3);
  auto model = cohort::testing::sharded_writer_model();
  ShardedOptimizer opt(model->parameters(), world.group(), cohort::testing::sharded_writer_adam());
  model->forward(torch::randn({2, 256})).sum().backward();
  opt.step();  // every shard has moments to save
  cohort::checkpoint::Checkpointer ckpt(
      a.file, world.group(), cohort::checkpoint::CheckpointerOptions().keep_last(2).shard_optimizer_state(true));
  std::int64_t step = 1;
  if (auto restored = ckpt.load_latest(*model, opt, torch::kCPU)) step = restored->progress.step + 1;
  std::cout << "pid " << ::getpid() << std::endl;
  for (;; ++step) {
    cohort::testing::mark(*model, opt, static_cast<double>(step));
    ckpt.save(*model, opt, {step, 0, 0, {}}, torch::kCPU);
    if (world.rank() == 0) std::cout << "saved " << step << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto args = parse(argc, argv);
  torch::set_num_threads(1);
  auto world = World::init();
  if (args.scenario == "parity") return parity(world, args);
  if (args.scenario == "resume") return resume(world, args);
  if (args.scenario == "amp") return amp(world, args);
  if (args.scenario == "mismatch") return mismatch(world, args);
  if (args.scenario == "accumulate") return accumulate(world, args);
  if (args.scenario == "writer") return writer(world, args);
  std::cerr << "unknown scenario " << args.scenario << std::endl;
  return 2;
}
