// One pipeline scenario per run, started by tests/multiproc/pipeline_test.cpp through
// `cohort run`. Each rank trains its stages and, in the same process, replays the
// single-process reference (the whole model on the whole batch); it prints
// "<scenario> ok ..." when they agree and exits 1 otherwise.
//   pipeline_worker parity SCHEDULE STAGES MICROBATCHES [VIRTUAL] [--recompute]
//   pipeline_worker recompute_dropout SCHEDULE STAGES MICROBATCHES
//   pipeline_worker varlen SCHEDULE MICROBATCHES
//   pipeline_worker mismatch | hang | bad_input | autocast | big_state | parameterless_stage
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "cohort/amp/autocast.h"
#include "cohort/comm/world.h"
#include "cohort/errors.h"
#include "cohort/pipeline/mesh.h"
#include "cohort/pipeline/pipeline.h"
#include "cohort/pipeline/split.h"

namespace {

using cohort::comm::World;
using namespace cohort::pipeline;

constexpr int kBlocks = 8, kRows = 12, kIn = 6, kWidth = 10, kClasses = 3, kSteps = 3;
constexpr double kTolerance = 1e-10;  // fp64: only the summation order differs

torch::nn::Sequential make_model(double dropout = 0) {
  torch::manual_seed(7);
  torch::nn::Sequential model;
  for (int b = 0; b < kBlocks; ++b) {
    const auto n = std::to_string(b);
    model->push_back("linear" + n, torch::nn::Linear(b == 0 ? kIn : kWidth, b + 1 == kBlocks ? kClasses : kWidth));
    if (b + 1 == kBlocks) break;
    model->push_back("tanh" + n, torch::nn::Tanh());
    if (dropout > 0) model->push_back("dropout" + n, torch::nn::Dropout(dropout));
  }
  model->to(torch::kDouble);
  return model;
}

// The global batch of `step`: data_size replicas' rows, replica d's are rows [d*kRows, (d+1)*kRows).
std::pair<torch::Tensor, torch::Tensor> batch(int step, int replicas) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  auto x = at::randn({kRows * replicas, kIn}, gen, torch::kDouble);
  auto y = at::randint(0, kClasses, {kRows * replicas}, gen, torch::kLong);
  return {x, y};
}

LossFn cross_entropy() {
  return [](const TensorList& out, const TensorList& y) { return torch::nn::functional::cross_entropy(out.at(0), y.at(0)); };
}

std::map<std::string, torch::Tensor> named(const torch::nn::Module& m, bool grads) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = grads ? item.value().grad() : item.value();
  return out;
}

double max_diff(const std::map<std::string, torch::Tensor>& mine, const std::map<std::string, torch::Tensor>& ref) {
  double worst = 0;
  for (const auto& [name, t] : mine) {
    auto it = ref.find(name);
    if (it == ref.end()) throw std::runtime_error("no reference for " + name);
    if (!t.defined() || !it->second.defined()) throw std::runtime_error("no gradient for " + name);
    worst = std::max(worst, (t - it->second).abs().max().item<double>());
  }
  return worst;
}

ScheduleKind kind_of(const std::string& s) { return parse_schedule_kind(s); }

struct Setup {
  int stages = 2, microbatches = 1, virtual_stages = 1;
  bool recompute = false;
  double dropout = 0;
};

// Trains kSteps on the pipeline (with DDP across replicas when the world has more
// ranks than stages); returns this rank's final parameters and, per step, its grads.
struct Trained {
  std::map<std::string, torch::Tensor> params;
  std::vector<std::map<std::string, torch::Tensor>> grads;
  std::vector<double> losses;
  torch::nn::Sequential whole;
};

Trained train_pipeline(World& world, const std::string& schedule, const Setup& s) {
  Mesh mesh(world, s.stages);
  auto model = make_model(s.dropout);
  const int total = s.stages * s.virtual_stages;
  // kBlocks / total blocks per stage; a block is linear, tanh (and dropout), the last one linear alone.
  const int per_block = s.dropout > 0 ? 3 : 2;
  std::vector<int> balance(total, kBlocks / total * per_block);
  balance.back() -= per_block - 1;
  auto parts = split_by_balance(model, balance);
  std::vector<PipelineStage> mine;
  for (int c = 0; c < s.virtual_stages; ++c) {
    const int stage = mesh.pipeline_rank() + c * s.stages;
    mine.emplace_back(parts[stage], stage);
  }
  Pipeline pipe(std::move(mine), mesh.pipeline_group(),
                PipelineOptions(cross_entropy())
                    .schedule(kind_of(schedule))
                    .microbatches(s.microbatches)
                    .virtual_stages(s.virtual_stages)
                    .recompute(s.recompute));
  if (mesh.data_size() > 1) pipe.data_parallel(mesh.data_group());
  torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(99 + mesh.data_rank());  // dropout: each replica its own stream, as a reference would
  Trained t;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, mesh.data_size());
    auto rows = torch::indexing::Slice(mesh.data_rank() * kRows, (mesh.data_rank() + 1) * kRows);
    opt.zero_grad();
    auto r = pipe.step({x.index({rows})}, {y.index({rows})});
    t.losses.push_back(r.loss);
    t.grads.push_back(named(*pipe.local_module(), true));
    for (auto& [k, v] : t.grads.back()) v = v.clone();
    opt.step();
  }
  t.params = named(*pipe.local_module(), false);
  t.whole = model;
  return t;
}

Trained train_reference(int replicas) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Trained t;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, replicas);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    t.losses.push_back(loss.item<double>());
    t.grads.push_back(named(*model, true));
    for (auto& [k, v] : t.grads.back()) v = v.clone();
    opt.step();
  }
  t.params = named(*model, false);
  return t;
}

int parity(World& world, const std::string& schedule, const Setup& s) {
  auto got = train_pipeline(world, schedule, s);
  auto ref = train_reference(world.size() / s.stages);
  double grad_diff = 0, loss_diff = 0;
  for (int step = 0; step < kSteps; ++step) grad_diff = std::max(grad_diff, max_diff(got.grads[step], ref.grads[step]));
  const double param_diff = max_diff(got.params, ref.params);
  if (world.size() == s.stages)  // one replica: its loss is the whole batch's
    for (int step = 0; step < kSteps; ++step) loss_diff = std::max(loss_diff, std::abs(got.losses[step] - ref.losses[step]));
  const bool ok = grad_diff < kTolerance && param_diff < kTolerance && loss_diff < kTolerance && !got.params.empty();
  std::cout << "parity " << (ok ? "ok" : "FAILED") << " rank " << world.rank() << " params " << got.params.size()
            << " max_grad_diff " << grad_diff << " max_param_diff " << param_diff << " max_loss_diff " << loss_diff
            << std::endl;
  return ok ? 0 : 1;
}

// Recomputing a stage with dropout draws the same masks: the run with recompute
// equals the run without it, bit for bit.
int recompute_dropout(World& world, const std::string& schedule, Setup s) {
  s.dropout = 0.3;
  s.recompute = false;
  auto plain = train_pipeline(world, schedule, s);
  s.recompute = true;
  auto again = train_pipeline(world, schedule, s);
  const double diff = max_diff(again.params, plain.params);
  const bool changed = max_diff(plain.params, named(*make_model(), false)) > 0;
  const bool ok = diff == 0 && changed;
  std::cout << "recompute_dropout " << (ok ? "ok" : "FAILED") << " rank " << world.rank() << " max_param_diff "
            << diff << std::endl;
  return ok ? 0 : 1;
}

// Two stages written by hand, passing two tensors, on micro-batches whose sequence
// length differs; compared with the same modules run in one process.
struct Encoder : torch::nn::Module {
  torch::nn::Linear proj{nullptr};
  Encoder() { proj = register_module("proj", torch::nn::Linear(4, 8)); }
};
struct Head : torch::nn::Module {
  torch::nn::Linear seq{nullptr}, pooled{nullptr};
  Head() {
    seq = register_module("seq", torch::nn::Linear(8, kClasses));
    pooled = register_module("pooled", torch::nn::Linear(4, kClasses));
  }
};
TensorList encode(Encoder& e, const TensorList& in) { return {torch::tanh(e.proj(in[0])), in[0].mean(1)}; }
torch::Tensor head(Head& h, const TensorList& in) { return h.seq(in[0]).mean(1) + h.pooled(in[1]); }

int varlen(World& world, const std::string& schedule, int microbatches) {
  const std::vector<int64_t> lengths{3, 7, 2, 5, 4, 6, 1, 8};
  torch::manual_seed(3);
  auto enc = std::make_shared<Encoder>();
  auto hd = std::make_shared<Head>();
  enc->to(torch::kDouble);
  hd->to(torch::kDouble);
  std::vector<TensorList> xs, ys;
  auto gen = at::detail::createCPUGenerator(5);
  for (int m = 0; m < microbatches; ++m) {
    const int64_t rows = 2 + m % 3;
    xs.push_back({at::randn({rows, lengths[m % lengths.size()], 4}, gen, torch::kDouble)});
    ys.push_back({at::randint(0, kClasses, {rows}, gen, torch::kLong)});
  }
  std::vector<PipelineStage> mine;
  if (world.rank() == 0)
    mine.emplace_back(enc, 0, [enc](const TensorList& in) { return encode(*enc, in); }, "encoder");
  else
    mine.emplace_back(hd, 1, [hd](const TensorList& in) { return TensorList{head(*hd, in)}; }, "head");
  Pipeline pipe(std::move(mine), world.group(),
                PipelineOptions(cross_entropy()).schedule(parse_schedule_kind(schedule)).microbatches(microbatches));
  auto r = pipe.step_microbatches(world.rank() == 0 ? xs : std::vector<TensorList>(),
                                  world.rank() == 1 ? ys : std::vector<TensorList>());
  // The reference: clones of the same modules, the micro-batches' losses weighted by rows.
  torch::manual_seed(3);  // the same initial weights as the pipeline's modules
  auto enc_ref = std::make_shared<Encoder>();
  auto hd_ref = std::make_shared<Head>();
  enc_ref->to(torch::kDouble);
  hd_ref->to(torch::kDouble);
  double total_rows = 0;
  for (const auto& y : ys) total_rows += y[0].size(0);
  auto loss = torch::zeros({}, torch::kDouble);
  for (int m = 0; m < microbatches; ++m)
    loss = loss + torch::nn::functional::cross_entropy(head(*hd_ref, encode(*enc_ref, xs[m])), ys[m][0]) *
                      (ys[m][0].size(0) / total_rows);
  loss.backward();
  const auto& mine_module = world.rank() == 0 ? static_cast<torch::nn::Module&>(*enc) : *hd;
  const auto& ref_module = world.rank() == 0 ? static_cast<torch::nn::Module&>(*enc_ref) : *hd_ref;
  const double diff = max_diff(named(mine_module, true), named(ref_module, true));
  const double loss_diff = std::abs(r.loss - loss.item<double>());
  const bool ok = diff < kTolerance && loss_diff < kTolerance;
  std::cout << "varlen " << (ok ? "ok" : "FAILED") << " rank " << world.rank() << " max_grad_diff " << diff
            << " loss_diff " << loss_diff << std::endl;
  return ok ? 0 : 1;
}

// Rank 1 asks for another micro-batch count: every rank must refuse, naming it.
int mismatch(World& world) {
  auto model = make_model();
  auto parts = split_by_parameters(model, 2);
  try {
    Pipeline pipe({PipelineStage(parts[world.rank()], world.rank())}, world.group(),
                  PipelineOptions(cross_entropy()).microbatches(world.rank() == 1 ? 4 : 2));
  } catch (const cohort::ConfigError& e) {
    std::cout << "mismatch ok rank " << world.rank() << ": " << e.what() << std::endl;
    return 0;
  }
  std::cout << "mismatch FAILED rank " << world.rank() << ": no error" << std::endl;
  return 1;
}

// Rank 1 builds its stage, then stops answering; rank 0 must time out naming it.
int hang(World& world) {
  auto model = make_model();
  auto parts = split_by_balance(model, {8, 7});
  Pipeline pipe({PipelineStage(parts[world.rank()], world.rank())}, world.group(),
                PipelineOptions(cross_entropy()).microbatches(2));
  if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(120));
  auto [x, y] = batch(0, 1);
  pipe.step({x}, {y});
  std::cout << "hang FAILED: the step finished" << std::endl;
  return 1;
}

// bf16 autocast inside the pipeline (PipelineOptions::autocast): the stages compute in
// bfloat16 (the last stage's outputs say so) and the gradients match one process
// under the same autocast to bfloat16's precision, while float32 gives other ones.
int autocast_parity(World& world) {
  auto model = make_model();
  model->to(torch::kFloat);
  auto reference = make_model();
  reference->to(torch::kFloat);
  auto parts = split_by_balance(model, {8, 7});
  bool saw_bf16 = false;
  LossFn loss = [&saw_bf16](const TensorList& out, const TensorList& y) {
    saw_bf16 = out.at(0).scalar_type() == torch::kBFloat16;
    return torch::nn::functional::cross_entropy(out.at(0), y.at(0));
  };
  const auto autocast = cohort::amp::AutocastOptions(torch::kCPU);
  Pipeline pipe({PipelineStage(parts[world.rank()], world.rank())}, world.group(),
                PipelineOptions(loss).schedule(ScheduleKind::k1F1B).microbatches(2).autocast(autocast));
  auto [x, y] = batch(0, 1);
  x = x.to(torch::kFloat);
  pipe.step({x}, {y});
  torch::Tensor ref_loss;
  {
    cohort::amp::Autocast guard(autocast);
    ref_loss = torch::nn::functional::cross_entropy(reference->forward(x), y);
  }
  ref_loss.backward();
  auto mine = named(*pipe.local_module(), true);
  auto ref = named(*reference, true);
  double worst = 0, largest = 0;
  for (const auto& [name, g] : mine) {
    worst = std::max(worst, (g - ref.at(name)).abs().max().item<double>());
    largest = std::max(largest, ref.at(name).abs().max().item<double>());
  }
  const bool ok = worst < 0.05 * largest && (world.rank() == 0 || saw_bf16);
  std::cout << "autocast " << (ok ? "ok" : "FAILED") << " rank " << world.rank() << " max_grad_diff " << worst
            << " of " << largest << " bf16_outputs " << saw_bf16 << std::endl;
  return ok ? 0 : 1;
}

// The batch has one feature too few for stage 0's first layer: the error says which
// stage and which action failed, beside LibTorch's own message.
int bad_input(World& world) {
  auto model = make_model();
  auto parts = split_by_balance(model, {8, 7});
  Pipeline pipe({PipelineStage(parts[world.rank()], world.rank())}, world.group(),
                PipelineOptions(cross_entropy()).microbatches(2));
  auto x = torch::randn({kRows, kIn - 1}, torch::kDouble);
  auto y = torch::zeros({kRows}, torch::kLong);
  pipe.step({x}, {y});
  std::cout << "bad_input FAILED: the step finished" << std::endl;
  return 1;
}

// Stage 1 holds more entries, of more dimensions, than one transfer carries: rank 0
// still assembles the whole state dict, every entry equal to rank 1's.
struct Many : torch::nn::Module {
  explicit Many(int n) {
    for (int i = 0; i < n; ++i) register_parameter("p" + std::to_string(i), torch::randn(std::vector<int64_t>(1 + i % 7, 2)));
  }
};

int big_state(World& world) {
  constexpr int kEntries = 150;
  torch::manual_seed(21);
  auto first = std::make_shared<torch::nn::LinearImpl>(2, 2);
  auto many = std::make_shared<Many>(kEntries);  // the same values on both ranks (same seed)
  std::vector<PipelineStage> mine;
  if (world.rank() == 0)
    mine.emplace_back(first, 0, [first](const TensorList& in) { return TensorList{first->forward(in[0])}; }, "first");
  else
    mine.emplace_back(many, 1, [](const TensorList& in) { return in; }, "many");
  Pipeline pipe(std::move(mine), world.group(), PipelineOptions(cross_entropy()).schedule(ScheduleKind::kGPipe));
  auto whole = pipe.full_state_dict();
  if (world.rank() != 0) {
    const bool ok = whole.empty();
    std::cout << "big_state " << (ok ? "ok" : "FAILED") << " rank 1" << std::endl;
    return ok ? 0 : 1;
  }
  int equal = 0;
  for (const auto& item : many->named_parameters())
    if (whole.contains("many." + item.key()) && torch::equal(whole.at("many." + item.key()), item.value())) ++equal;
  const bool ok = equal == kEntries && static_cast<int>(whole.size()) == kEntries + 2 && whole.contains("first.weight");
  std::cout << "big_state " << (ok ? "ok" : "FAILED") << " rank 0 entries " << whole.size() << " equal " << equal
            << std::endl;
  return ok ? 0 : 1;
}

// DP 2 x PP 2 where the last stage has nothing to train (a Tanh): it gets no DDP,
// the first stage's gradients still equal one process on the whole batch, and the
// assembled state dict has every parameter (the last stage sends none).
int parameterless_stage(World& world) {
  auto make = [] {
    auto m = make_model();
    m->push_back("tanh_out", torch::nn::Tanh());
    return m;
  };
  Mesh mesh(world, 2);
  auto parts = split_by_balance(make(), {2 * kBlocks - 1, 1});
  Pipeline pipe({PipelineStage(parts[mesh.pipeline_rank()], mesh.pipeline_rank())}, mesh.pipeline_group(),
                PipelineOptions(cross_entropy()).schedule(ScheduleKind::k1F1B).microbatches(2));
  pipe.data_parallel(mesh.data_group());
  auto reference = make();
  torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, mesh.data_size());
    auto rows = torch::indexing::Slice(mesh.data_rank() * kRows, (mesh.data_rank() + 1) * kRows);
    opt.zero_grad();
    pipe.step({x.index({rows})}, {y.index({rows})});
    opt.step();
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    ref_opt.step();
  }
  auto whole = pipe.full_state_dict();
  bool ok = true;
  double diff = 0;
  if (mesh.pipeline_rank() == 0) {
    diff = max_diff(named(*pipe.local_module(), false), named(*reference, false));
    ok = diff < kTolerance && whole.size() == reference->named_parameters().size();
  } else {
    ok = pipe.parameters().empty() && whole.empty();
  }
  std::cout << "parameterless_stage " << (ok ? "ok" : "FAILED") << " rank " << world.rank() << " max_param_diff "
            << diff << " entries " << whole.size() << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    auto world = World::init();
    const std::string scenario = a.at(0);
    if (scenario == "mismatch") return mismatch(world);
    if (scenario == "hang") return hang(world);
    if (scenario == "bad_input") return bad_input(world);
    if (scenario == "autocast") return autocast_parity(world);
    if (scenario == "big_state") return big_state(world);
    if (scenario == "parameterless_stage") return parameterless_stage(world);
    if (scenario == "varlen") return varlen(world, a.at(1), std::stoi(a.at(2)));
    Setup s;
    s.stages = std::stoi(a.at(2));
    s.microbatches = std::stoi(a.at(3));
    if (a.size() > 4 && a[4] != "--recompute") s.virtual_stages = std::stoi(a[4]);
    s.recompute = std::find(a.begin(), a.end(), "--recompute") != a.end();
    if (scenario == "parity") return parity(world, a.at(1), s);
    if (scenario == "recompute_dropout") return recompute_dropout(world, a.at(1), s);
    std::cerr << "unknown scenario " << scenario << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "pipeline_worker: " << e.what() << std::endl;
    return 1;
  }
}
