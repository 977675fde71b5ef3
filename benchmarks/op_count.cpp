// Operators dispatched per training step (issue 48): the CPU-measurable proxy of how
// much a step launches on a GPU. compare_op_count.sh runs it beside op_count_peer.py
// (the same models and step in PyTorch, counted through its profiler), one process
// per rank under `cohort run`:
//
//   op_count [--model fashion|mlp|cnn|deep|all] [--optimizer cohort|torch] [--mode local|ddp]
//            [--steps N] [--warmup W]
//
// A step is the optimizer's zero_grad (with its defaults, as PyTorch's), forward,
// cross entropy, backward and Adam's step with its defaults; with --optimizer cohort it is
// cohort::optim::Adam with StepKernel::automatic, with --optimizer torch
// torch::optim::Adam. After W warm-up steps (DDP rebuilds its buckets after the
// first), a RecordFunction callback counts the N steps' operators; rank 0 prints one
// JSON line per model with the counts per step, in all and by phase.
//
// Note [What counts as an operator]: every RecordFunction event of scope FUNCTION
// that names an operator (RecordFunction::operator_name(): what the dispatcher
// records) is one operator, on every thread: a global callback, because autograd runs
// backward on its own threads and DDP communicates on others. That leaves out the
// autograd engine's "autograd::engine::evaluate_function: X" wrappers (scope
// FUNCTION, but no operator), the autograd nodes themselves (scope
// BACKWARD_FUNCTION) and user annotations (USER_SCOPE); op_count_peer.py applies the
// same filter to its profiler's events. "top level" counts only the operators that
// no other counted operator encloses on the same thread: what the code called,
// without the operators that those call inside (aten::linear's aten::addmm).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <ATen/record_function.h>

#include <atomic>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench_models.h"
#include "model.h"  // examples/fashion_mnist: the trainer's network
#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/elastic/error_file.h"
#include "cohort/optim/adam.h"
#include "cohort/trace/world_timeline.h"

namespace {

using cohort::comm::World;
using Json = nlohmann::ordered_json;

struct Args {
  std::string model = "all";         // fashion, mlp, cnn, deep, or all
  std::string optimizer = "cohort";  // cohort (cohort::optim::Adam) or torch (torch::optim::Adam)
  std::string mode = "local";        // local or ddp
  int steps = 10;
  int warmup = 3;
};

// The counters of the global callback, which takes plain function pointers.
std::atomic<std::int64_t> operators{0}, top_level{0};
thread_local int depth = 0;  // counted operators open on this thread

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!fn.operator_name()) return nullptr;
  operators.fetch_add(1, std::memory_order_relaxed);
  if (depth++ == 0) top_level.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (fn.operator_name()) --depth;
}

// Counts while it lives (Note [What counts as an operator]).
class OperatorCounter {
 public:
  OperatorCounter()
      : handle_(at::addGlobalCallback(
            at::RecordFunctionCallback(on_start, on_end).scopes({at::RecordScope::FUNCTION}).needsInputs(false))) {
    operators = 0;
    top_level = 0;
  }
  ~OperatorCounter() { at::removeCallback(handle_); }
  OperatorCounter(const OperatorCounter&) = delete;
  OperatorCounter& operator=(const OperatorCounter&) = delete;

 private:
  at::CallbackHandle handle_;
};

// A model with its optimizer and one batch, made once and reused, with or without
// cohort's DDP around the model.
struct Trainer {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::shared_ptr<void> keep;  // the model, or the DDP wrapper holding it
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  cohort::bench::Batch batch;
};

template <class Holder>
Trainer make_trainer(Holder model, const Args& a, World& world, std::int64_t bucket_cap_mb) {
  Trainer t;
  if (a.mode == "ddp") {
    auto ddp = std::make_shared<cohort::ddp::DistributedDataParallel<Holder>>(
        model, world.group(), cohort::ddp::DistributedDataParallelOptions().bucket_cap_bytes(bucket_cap_mb << 20));
    t.forward = [d = ddp.get()](const torch::Tensor& x) { return (*d)(x); };
    t.keep = ddp;
  } else {
    t.forward = [model](const torch::Tensor& x) mutable { return model->forward(x); };
    t.keep = model.ptr();
  }
  if (a.optimizer == "cohort")
    t.optimizer = std::make_unique<cohort::optim::Adam>(model->parameters());
  else
    t.optimizer = std::make_unique<torch::optim::Adam>(model->parameters());
  return t;
}

// The trainer's network is not in bench_models.h: the input and batch of the
// Fashion-MNIST trainer (options.h: 32 per rank).
const cohort::bench::ModelSpec kFashion{"fashion", {1, 28, 28}, 32, 0, 25};

Trainer make_trainer(const cohort::bench::ModelSpec& spec, const Args& a, World& world) {
  torch::manual_seed(0);
  auto t = spec.name == "fashion" ? make_trainer(fashion_mnist::FashionNet(), a, world, spec.bucket_cap_mb)
                                  : make_trainer(cohort::bench::make_model(spec.name), a, world, spec.bucket_cap_mb);
  t.batch = cohort::bench::make_batch(spec, world.rank());
  return t;
}

// The kernel cohort::optim::Adam's step runs on these parameters, or "for-loop" for
// torch::optim::Adam.
std::string step_kernel(const Trainer& t) {
  auto* adam = dynamic_cast<cohort::optim::Adam*>(t.optimizer.get());
  if (adam == nullptr) return "for-loop";
  const auto& p = t.optimizer->param_groups().front().params().front();
  return cohort::optim::to_string(cohort::optim::resolve(adam->kernel(), p.device(), p.scalar_type()));
}

int count(const Args& a, World& world) {
  std::vector<cohort::bench::ModelSpec> specs{kFashion};
  for (const auto& s : cohort::bench::model_specs()) specs.push_back(s);
  for (const auto& spec : specs) {
    if (a.model != "all" && a.model != spec.name) continue;
    auto t = make_trainer(spec, a, world);
    // The phases, in operators so far: after zero_grad, forward with the loss,
    // backward, step.
    std::vector<std::int64_t> phases(4, 0);
    auto step = [&t](std::vector<std::int64_t>* marks) {
      auto mark = [marks](int i) {
        if (marks != nullptr) (*marks)[i] += operators.load();
      };
      std::int64_t before = operators.load();
      t.optimizer->zero_grad();
      mark(0);
      auto loss = torch::nn::functional::cross_entropy(t.forward(t.batch.input), t.batch.target);
      mark(1);
      loss.backward();
      mark(2);
      t.optimizer->step();
      mark(3);
      if (marks != nullptr)
        for (auto& m : *marks) m -= before;
    };
    for (int i = 0; i < a.warmup; ++i) step(nullptr);
    world.group().barrier();
    std::int64_t total = 0, top = 0;
    {
      OperatorCounter counter;
      for (int i = 0; i < a.steps; ++i) step(&phases);
      total = operators.load();
      top = top_level.load();
    }
    if (world.rank() != 0) continue;
    auto per_step = [&a](std::int64_t n) { return static_cast<double>(n) / a.steps; };
    std::cout << Json{{"impl", "cohort"},
                      {"torch", TORCH_VERSION},
                      {"model", spec.name},
                      {"optimizer", a.optimizer == "cohort" ? "cohort::optim::Adam" : "torch::optim::Adam"},
                      {"kernel", step_kernel(t)},
                      {"mode", a.mode},
                      {"world", world.size()},
                      {"batch", spec.batch},
                      {"steps", a.steps},
                      {"ops_per_step", per_step(total)},
                      {"top_level_per_step", per_step(top)},
                      {"zero_grad", per_step(phases[0])},
                      {"forward", per_step(phases[1] - phases[0])},
                      {"backward", per_step(phases[2] - phases[1])},
                      {"step", per_step(phases[3] - phases[2])}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"operators dispatched per training step, cohort (see BENCHMARKS.md)"};
  Args a;
  app.add_option("--model", a.model, "fashion (the trainer's network), mlp, cnn, deep, or all")
      ->check(CLI::IsMember({"fashion", "mlp", "cnn", "deep", "all"}));
  app.add_option("--optimizer", a.optimizer, "cohort (cohort::optim::Adam, automatic kernel) or torch (torch::optim::Adam)")
      ->check(CLI::IsMember({"cohort", "torch"}));
  app.add_option("--mode", a.mode, "local, or ddp (cohort's DistributedDataParallel)")
      ->check(CLI::IsMember({"local", "ddp"}));
  app.add_option("--steps", a.steps, "steps counted")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "steps before counting")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  return cohort::elastic::record([&] {
    torch::set_num_threads(1);
    auto world = World::init(cohort::trace::traced());
    return count(a, world);
  });
}
