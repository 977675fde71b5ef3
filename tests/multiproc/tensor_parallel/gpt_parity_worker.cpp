// Started by tests/multiproc/tensor_parallel_test.cpp through `cohort run`: the GPT
// of examples/gpt on a device mesh (data x pipeline x tensor) against the same model
// in one process. Every rank builds, from the same seed, the model split over its
// mesh and in the same process the model over a group of one (this rank alone: no
// collective), which trains on the whole global batch with the same optimizer. The
// mesh's model trains on this data rank's rows, under DDP, ZeRO-1/2 (ShardedOptimizer),
// ZeRO-3 (fully_shard) over the data group, or a pipeline (examples/gpt/pipeline.h).
// After each step the global batch's loss is compared; after the last, each of this
// rank's parameters against the reference's slice of it. Prints
// "gpt <label> ok rank R ..." when all agree within 1e-5, and exits 1 otherwise.
//   gpt_parity_worker LABEL [--dp D] [--tp T] [--pp P] [--sp] [--strategy none|ddp|zero1|zero2|zero3]
//                           [--dropout p] [--recompute] [--optimizer sgd|adamw] [--layers L] [--steps K]
//                           [--amp] [--unchecked]
// --recompute checkpoints each block (a pipeline: each stage); --amp runs both sides
// under bf16 autocast and compares within bf16's precision (losses 5e-2, weights 1e-2).
// A combination tensor_parallel::check_composition refuses prints
// "gpt <label> refused rank R: <why>" and exits 3 (--unchecked runs it anyway).
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <unordered_set>

#include "cohort/amp/autocast.h"
#include "cohort/comm/device_mesh.h"
#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/tensor_parallel/composition.h"
#include "cohort/recompute/checkpoint.h"
#include "cohort/tensor_parallel/cross_entropy.h"
#include "cohort/zero/fully_shard.h"
#include "cohort/zero/sharded_optimizer.h"
#include "model.h"
#include "pipeline.h"

namespace {

namespace tp = cohort::tensor_parallel;
using cohort::comm::MeshDim;

struct Args {
  std::string label;
  int dp = 1, tp = 2, pp = 1;
  bool sp = false, recompute = false;
  bool amp = false;  // bf16 autocast on both sides
  bool unchecked = false;  // skip check_composition: what a refused combination would do
  std::string strategy = "none", optimizer = "sgd";
  double dropout = 0.0;
  int layers = 2, steps = 5;
};

Args parse(int argc, char** argv) {
  if (argc < 2) throw std::invalid_argument("usage: gpt_parity_worker LABEL [flags]");
  Args a;
  a.label = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--dp") a.dp = std::stoi(value());
    else if (flag == "--tp") a.tp = std::stoi(value());
    else if (flag == "--pp") a.pp = std::stoi(value());
    else if (flag == "--sp") a.sp = true;
    else if (flag == "--recompute") a.recompute = true;
    else if (flag == "--unchecked") a.unchecked = true;
    else if (flag == "--amp") a.amp = true;
    else if (flag == "--strategy") a.strategy = value();
    else if (flag == "--optimizer") a.optimizer = value();
    else if (flag == "--dropout") a.dropout = std::stod(value());
    else if (flag == "--layers") a.layers = std::stoi(value());
    else if (flag == "--steps") a.steps = std::stoi(value());
    else throw std::invalid_argument("unknown flag " + flag);
  }
  if (a.recompute && a.pp == 1 && a.strategy != "none" && a.strategy != "zero2")
    throw std::invalid_argument("--recompute without a pipeline runs with --strategy none or zero2 only");
  return a;
}

int zero_stage(const std::string& strategy) {
  return strategy == "zero1" ? 1 : strategy == "zero2" ? 2 : strategy == "zero3" ? 3 : 0;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<at::Tensor> params) {
  // Attention's key bias has a gradient of zero in exact arithmetic (softmax ignores
  // a shift shared by a row of scores): in fp32 it is rounding noise of about 1e-9,
  // which Adam with its usual eps of 1e-8 would turn into steps of +-lr, different
  // in each run. A larger eps keeps such noise small, and the other gradients
  // (1e-3 and up) still take Adam's normalised steps.
  if (kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.1).eps(1e-5));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// The reference's part of the parameter `name` of the TP module `module`: the slice
// this rank holds (Note [Whole, then sliced]).
at::Tensor reference_slice(const torch::nn::Module& module, const std::string& name, const at::Tensor& whole) {
  if (auto* c = dynamic_cast<const tp::ColumnParallelLinearImpl*>(&module))
    return whole.slice(0, c->first_output(), c->last_output());
  if (auto* r = dynamic_cast<const tp::RowParallelLinearImpl*>(&module))
    return name == "weight" ? whole.slice(1, r->first_input(), r->last_input()) : whole;
  if (auto* e = dynamic_cast<const tp::VocabParallelEmbeddingImpl*>(&module))
    return whole.slice(0, e->first_row(), e->last_row());
  return whole;
}

// The model's forward with each block checkpointed (activation checkpointing
// without a pipeline): backward recomputes the block, its TP collectives and its
// dropout masks included.
at::Tensor checkpointed(gpt::Gpt& model, const at::Tensor& ids, bool recompute) {
  if (!recompute) return model(ids);
  using cohort::recompute::TensorList;
  auto x = model->embed_tokens(ids);
  for (const auto& block : *model->blocks) {
    auto* b = block->as<tp::ParallelTransformerBlock>();
    auto segment = [b](const TensorList& in) { return TensorList{b->forward(in[0])}; };
    x = cohort::recompute::checkpoint(segment, {x}, cohort::recompute::CheckpointOptions().modules({block}))[0];
  }
  return model->head(x);
}

struct Comparison {
  double max_diff = 0;
  int compared = 0;
  std::string worst;  // the parameter of max_diff
  void add(const std::string& name, const at::Tensor& got, const at::Tensor& expected) {
    const double diff = (got - expected).abs().max().item<double>();
    if (diff >= max_diff) {
      max_diff = diff;
      worst = name;
    }
    ++compared;
  }
};

// Each parameter of `model` (restricted to `only`, if given) against the reference's.
void compare(const gpt::Gpt& model, const gpt::Gpt& reference, const std::unordered_set<const void*>* only,
             Comparison& out) {
  auto ref_modules = reference->named_modules();
  for (const auto& item : model->named_modules()) {
    const auto& ref_params = ref_modules[item.key()]->named_parameters(/*recurse=*/false);
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      if (only && !only->count(p.value().unsafeGetTensorImpl())) continue;
      out.add(item.key() + "." + p.key(), p.value(), reference_slice(*item.value(), p.key(), ref_params[p.key()]));
    }
  }
}

}  // namespace

int run(const Args& a);

int main(int argc, char** argv) {
  const auto a = parse(argc, argv);
  try {
    return run(a);
  } catch (const cohort::ConfigError& e) {
    const char* rank = std::getenv("RANK");  // set by cohort run
    std::cout << "gpt " << a.label << " refused rank " << (rank ? rank : "?") << ": " << e.what() << std::endl;
    return 3;
  }
}

int run(const Args& a) {
  torch::set_num_threads(1);
  // Refused before the world exists: every rank refuses alike, and none leaves while
  // another is still inside World::init's collectives (which would end that one with
  // "Connection closed by peer" instead of the refusal).
  if (!a.unchecked) {
    tp::check_composition(
        tp::Composition().data(a.dp).pipeline(a.pp).tensor(a.tp).zero(zero_stage(a.strategy)).sequence_parallel(a.sp));
  }
  auto world = cohort::comm::World::init();
  const int r = world.rank(), n = world.size();
  cohort::comm::DeviceMesh mesh(world, cohort::comm::MeshShape().data(a.dp).pipeline(a.pp).tensor(a.tp));
  cohort::comm::Group alone;  // every rank creates every group of one: new_group is collective
  for (int q = 0; q < n; ++q) {
    auto g = world.new_group({q});
    if (q == r) alone = g;
  }
  auto& tp_group = mesh.group(MeshDim::kTensor);
  auto& data_group = mesh.group(MeshDim::kData);
  const int d = mesh.coordinate(MeshDim::kData), data_size = mesh.size(MeshDim::kData);

  auto options = gpt::GptOptions(64).context(8).embed_dim(32).num_heads(4).layers(a.layers).dropout(a.dropout);
  torch::manual_seed(7);
  gpt::Gpt reference(alone, options);
  torch::manual_seed(7);
  gpt::Gpt model(tp_group, gpt::GptOptions(options).sequence_parallel(a.sp));
  auto ref_opt = make_optimizer(a.optimizer, reference->parameters());

  // The strategies over the data group (at most one is set).
  std::optional<cohort::ddp::DistributedDataParallel<gpt::Gpt>> ddp;
  std::optional<cohort::zero::FullyShard<gpt::GptImpl>> root;
  std::optional<cohort::zero::FullyShardedModel> sharded;
  std::optional<gpt::GptPipeline> pipe;
  std::unique_ptr<torch::optim::Optimizer> opt;
  auto factory = [&](std::vector<at::Tensor> p) { return make_optimizer(a.optimizer, std::move(p)); };
  // ZeRO-1 steps over the data group what DDP (or the pipeline's DDP) reduced.
  auto plain_or_zero1 = [&](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    if (a.strategy == "zero1") return std::make_unique<cohort::zero::ShardedOptimizer>(params, data_group, factory);
    return make_optimizer(a.optimizer, params);
  };
  if (a.pp > 1) {
    auto pipe_options = gpt::GptPipelineOptions().microbatches(2).recompute(a.recompute);
    if (a.amp) pipe_options.autocast(cohort::amp::AutocastOptions(torch::kCPU).dtype(torch::kBFloat16));
    pipe.emplace(model, world, mesh, pipe_options);
    if (a.strategy == "ddp" || a.strategy == "zero1") pipe->data_parallel();
    opt = plain_or_zero1(pipe->parameters());
  } else if (a.strategy == "ddp" || a.strategy == "zero1") {
    ddp.emplace(model, data_group);
    opt = plain_or_zero1(model->parameters());
  } else if (a.strategy == "zero2") {
    opt = std::make_unique<cohort::zero::ShardedOptimizer>(
        model->parameters(), data_group, factory, cohort::zero::ShardedOptimizerOptions().shard_gradients(true));
  } else if (a.strategy == "zero3") {
    root.emplace(model);
    sharded = cohort::zero::fully_shard(*root, data_group);
    opt = make_optimizer(a.optimizer, sharded->parameters());
  } else {
    opt = make_optimizer(a.optimizer, model->parameters());
  }

  const std::int64_t batch = 4, rows = batch / data_size;
  double loss_diff = 0;
  for (int step = 0; step < a.steps; ++step) {
    torch::manual_seed(100 + step);
    auto ids = torch::randint(0, 64, {batch, 8}, torch::kLong);
    auto targets = torch::randint(0, 64, {batch, 8}, torch::kLong);
    auto my_ids = ids.slice(0, d * rows, (d + 1) * rows), my_targets = targets.slice(0, d * rows, (d + 1) * rows);

    torch::manual_seed(200 + step);  // the same dropout draws on both sides
    ref_opt->zero_grad();
    at::Tensor ref_loss;
    {
      std::optional<cohort::amp::Autocast> autocast;
      if (a.amp) autocast.emplace(cohort::amp::AutocastOptions(torch::kCPU).dtype(torch::kBFloat16));
      ref_loss = reference->loss(reference(ids), targets);
    }
    ref_loss.backward();
    ref_opt->step();

    torch::manual_seed(200 + step);
    opt->zero_grad();
    at::Tensor loss;
    if (pipe) {
      loss = torch::tensor(pipe->step(my_ids, my_targets).loss);
    } else {
      {
        std::optional<cohort::amp::Autocast> autocast;
        if (a.amp) autocast.emplace(cohort::amp::AutocastOptions(torch::kCPU).dtype(torch::kBFloat16));
        auto logits = ddp ? (*ddp)(my_ids) : root ? (*root)(my_ids) : checkpointed(model, my_ids, a.recompute);
        loss = tp::vocab_parallel_cross_entropy(logits, my_targets, tp_group);
      }
      loss.backward();
      if (a.sp) tp::sum_replicated_gradients(*model, tp_group);
    }
    opt->step();
    // This data rank's rows' loss; the global batch's is their mean.
    auto global = loss.detach().to(torch::kFloat).clone();  // bfloat16 under --amp
    data_group.all_reduce(global);
    loss_diff = std::max(loss_diff, std::abs(global.item<double>() / data_size - ref_loss.item<double>()));
  }

  Comparison weights;
  {
    std::optional<cohort::zero::FullyShardedModel::FullParameters> full;
    if (sharded) full.emplace(sharded->schedule(), false);
    if (pipe) {
      std::unordered_set<const void*> mine;
      for (const auto& p : pipe->stage()->parameters()) mine.insert(p.unsafeGetTensorImpl());
      compare(model, reference, &mine, weights);
      if (pipe->stage()->output) {  // the last stage's copy of the tied table
        const auto& out = pipe->stage()->output;
        weights.add("output.weight (tied copy)", out->weight,
                    reference->embed->weight.slice(0, out->first_row(), out->last_row()));
      }
    } else {
      compare(model, reference, nullptr, weights);
    }
  }
  // Under bf16 autocast the TP ranks round their partial sums before adding them,
  // where one process rounds once, and the loss itself is a bfloat16 (spacing 1/32
  // near ln 64): agreement to bf16's precision, not fp32's.
  const double loss_tolerance = a.amp ? 5e-2 : 1e-5, weight_tolerance = a.amp ? 1e-2 : 1e-5;
  const bool ok = loss_diff < loss_tolerance && weights.max_diff < weight_tolerance && weights.compared > 0;
  std::cout << "gpt " << a.label << (ok ? " ok" : " FAILED") << " rank " << r << " world " << n << " mesh "
            << mesh.describe() << " steps " << a.steps << " max_loss_diff " << loss_diff << " max_weight_diff "
            << weights.max_diff << " (" << weights.worst << ") parameters_compared " << weights.compared << std::endl;
  return ok ? 0 : 1;
}
