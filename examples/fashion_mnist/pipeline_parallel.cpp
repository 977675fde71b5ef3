// The trainer under --pipeline-stages S: FashionNet cut into S stages (S x V with
// --virtual-stages), one per rank, and N/S data-parallel replicas of that pipeline,
// each stage under DDP across the replicas (cohort::pipeline, docs/pipeline.md).
#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <numeric>

#include "cohort/data/to_device.h"
#include "checkpointing.h"
#include "cohort/pipeline/checkpoint.h"
#include "cohort/pipeline/mesh.h"
#include "cohort/pipeline/pipeline.h"
#include "cohort/pipeline/split.h"
#include "model.h"
#include "strategy.h"

namespace fashion_mnist {
namespace {

using namespace cohort::pipeline;

// FashionNet's layers as a Sequential with the same names (conv1, conv2, fc1, fc2),
// so the assembled state dict loads into fashion_net.py, and with the same initial
// weights as the plain trainer for the same seed.
torch::nn::Sequential as_sequential(const TrainerOptions& o, c10::Device device) {
  torch::manual_seed(o.seed);
  FashionNet net;
  net->to(device);
  const bool nhwc = o.memory_format == "channels-last";
  if (nhwc) net->use_channels_last();
  auto child = [&](const char* name) { return net->named_children()[name]; };
  torch::nn::Sequential seq;
  if (nhwc) seq->push_back("nhwc", torch::nn::Functional([](torch::Tensor x) {
    return x.contiguous(torch::MemoryFormat::ChannelsLast);
  }));
  auto pool_relu = [] {  // Note [Pool, then ReLU]
    return torch::nn::Functional([](torch::Tensor x) { return torch::relu(torch::max_pool2d(x, 2)); });
  };
  seq->push_back("conv1", torch::nn::Conv2d(std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(child("conv1"))));
  seq->push_back("pool1", pool_relu());
  seq->push_back("conv2", torch::nn::Conv2d(std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(child("conv2"))));
  seq->push_back("pool2", pool_relu());
  seq->push_back("flatten", torch::nn::Functional([](torch::Tensor x) { return x.flatten(1); }));
  seq->push_back("fc1", torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(child("fc1"))));
  seq->push_back("relu", torch::nn::Functional([](torch::Tensor x) { return torch::relu(x); }));
  seq->push_back("fc2", torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(child("fc2"))));
  return seq;
}

// Each stage starts at a layer with weights, so every stage has parameters to train.
std::vector<std::string> split_points(int stages) {
  const std::vector<std::vector<std::string>> points{{}, {"fc1"}, {"conv2", "fc1"}, {"conv2", "fc1", "fc2"}};
  return points.at(static_cast<std::size_t>(stages - 1));
}

class PipelineParallel : public Strategy {
 public:
  PipelineParallel(const TrainerOptions& o, cohort::comm::World& world, c10::Device device)
      : world_(world), device_(device), mesh_(world, o.pipeline_stages), pipe_(build(o, mesh_, device)) {
    if (mesh_.data_size() > 1) pipe_.data_parallel(mesh_.data_group());
  }

  torch::nn::Module& model() override { return *pipe_.local_module(); }
  int replicas() const override { return mesh_.data_size(); }
  int replica() const override { return mesh_.data_rank(); }
  std::int64_t min_batch_rows() const override { return pipe_.schedule().microbatches; }

  // Autocast runs inside the pipeline (PipelineOptions::autocast, set in build());
  // under fp16 the loss is scaled there by the scaler's scale.
  at::Tensor forward_backward(const torch::Tensor& data, const torch::Tensor& target, MixedPrecision& precision,
                              cohort::trace::StepProfiler& profiler) override {
    auto p = profiler.phase("pipeline");
    auto r = pipe_.step({cohort::data::to_device(data, device_)}, {cohort::data::to_device(target, device_)}, precision.loss_scale());
    step_seconds_ += r.step_seconds;
    compute_seconds_ += r.compute_seconds;
    peak_live_ = std::max(peak_live_, r.peak_live_microbatches);
    return torch::scalar_tensor(r.loss, torch::kFloat64);
  }

  Evaluation evaluate(cohort::data::FashionMnist& test) override {
    constexpr std::size_t kBatch = 1000;
    const std::size_t n = test.size().value();
    const auto replicas = static_cast<std::size_t>(mesh_.data_size()), me = static_cast<std::size_t>(mesh_.data_rank());
    const std::size_t begin = n * me / replicas, end = n * (me + 1) / replicas;
    pipe_.local_module()->eval();
    double correct = 0, loss_sum = 0;
    for (std::size_t first = begin; first < end; first += kBatch) {
      std::vector<std::size_t> indices(std::min(kBatch, end - first));
      std::iota(indices.begin(), indices.end(), first);
      auto batch = test.get_batch(indices);
      // In float32 under --amp too, as the plain trainer evaluates (evaluate.cpp).
      auto out = pipe_.forward({batch.data.to(device_)}, 1, /*mixed_precision=*/false);
      if (!pipe_.is_last()) continue;
      auto target = batch.target.to(device_);
      loss_sum += torch::nn::functional::cross_entropy(
                      out[0], target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .item<double>();
      correct += out[0].argmax(1).eq(target).sum().item<double>();
    }
    pipe_.local_module()->train();
    // The last stage has the counts: it shares them along its pipeline, then the
    // replicas sum theirs.
    auto sums = torch::tensor({correct, static_cast<double>(end - begin), loss_sum},
                              torch::dtype(torch::kFloat64).device(device_));
    pipe_.group().broadcast(sums, pipe_.group().size() - 1);
    if (mesh_.data_size() > 1) mesh_.data_group().all_reduce(sums);
    auto cpu = sums.cpu();
    return {static_cast<std::int64_t>(cpu[0].item<double>()), static_cast<std::int64_t>(cpu[1].item<double>()),
            cpu[2].item<double>()};
  }

  std::unique_ptr<cohort::checkpoint::Checkpointer> checkpointer(const TrainerOptions& o) override {
    checkpoint_root_ = o.checkpoint_dir;
    return std::make_unique<cohort::checkpoint::Checkpointer>(
        stage_directory(o.checkpoint_dir, pipe_), mesh_.data_group(),
        checkpointer_options(o));
  }

  std::optional<cohort::checkpoint::Restored> resume(cohort::checkpoint::Checkpointer& checkpointer,
                                                     torch::optim::Optimizer& optimizer) override {
    return load_agreed(checkpoint_root_, pipe_, checkpointer, optimizer, world_.group(), device_);
  }

  c10::Dict<std::string, at::Tensor> final_state() override {
    auto whole = pipe_.full_state_dict();
    return world_.rank() == 0 ? whole : c10::Dict<std::string, at::Tensor>();
  }

  // Per pipeline rank of replica 0: the measured bubble (1 - compute / step time),
  // the most micro-batches it held at once, and its peak memory.
  nlohmann::json summary() override {
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);
    const double bubble = step_seconds_ > 0 ? 1.0 - compute_seconds_ / step_seconds_ : 0.0;
    auto mine = torch::tensor({bubble, static_cast<double>(peak_live_), usage.ru_maxrss / 1024.0},
                              torch::dtype(torch::kFloat64).device(device_));
    auto all = pipe_.group().all_gather(mine);
    nlohmann::json stages = nlohmann::json::array();
    double bubble_sum = 0;
    for (std::size_t r = 0; r < all.size(); ++r) {
      auto v = all[r].cpu();
      bubble_sum += v[0].item<double>();
      stages.push_back({{"pipeline_rank", r},
                        {"stages", stage_indices(static_cast<int>(r))},
                        {"bubble_fraction", v[0].item<double>()},
                        {"peak_live_microbatches", static_cast<int>(v[1].item<double>())},
                        {"peak_rss_mb", v[2].item<double>()}});
    }
    const auto& s = pipe_.schedule();
    return {{"pipeline",
             {{"schedule", to_string(s.kind)},
              {"stages", s.stages()},
              {"virtual_stages", s.virtual_stages},
              {"microbatches", s.microbatches},
              {"data_parallel_replicas", mesh_.data_size()},
              {"recompute", recompute_},
              {"bubble_fraction_measured", bubble_sum / static_cast<double>(all.size())},
              {"bubble_fraction_simulated", pipe_.simulated().bubble_fraction},
              {"per_rank", stages}}}};
  }

 private:
  Pipeline build(const TrainerOptions& o, Mesh& mesh, c10::Device device) {
    recompute_ = o.activation_checkpointing;
    auto model = as_sequential(o, device);
    const int total = o.pipeline_stages * o.virtual_stages;
    auto parts = split_at(model, split_points(total));
    std::vector<PipelineStage> mine;
    for (int c = 0; c < o.virtual_stages; ++c) {
      const int stage = mesh.pipeline_rank() + c * o.pipeline_stages;
      mine.emplace_back(parts.at(static_cast<std::size_t>(stage)), stage);
    }
    auto loss = [](const TensorList& out, const TensorList& y) {
      return torch::nn::functional::cross_entropy(out.at(0), y.at(0));
    };
    auto options = PipelineOptions(loss)
                       .schedule(parse_schedule_kind(o.pipeline_schedule))
                       .microbatches(o.microbatches)
                       .virtual_stages(o.virtual_stages)
                       .recompute(o.activation_checkpointing)
                       .device(device);
    if (const auto dtype = cohort::amp::parse_amp_dtype(o.amp))
      options.autocast(cohort::amp::AutocastOptions(device.type()).dtype(*dtype));
    return Pipeline(std::move(mine), mesh.pipeline_group(), options);
  }

  std::vector<int> stage_indices(int pipeline_rank) const {
    std::vector<int> out;
    const auto& s = pipe_.schedule();
    for (int c = 0; c < s.virtual_stages; ++c) out.push_back(pipeline_rank + c * s.ranks);
    return out;
  }

  cohort::comm::World& world_;
  c10::Device device_;
  Mesh mesh_;
  bool recompute_ = false;
  std::string checkpoint_root_;
  Pipeline pipe_;
  double step_seconds_ = 0, compute_seconds_ = 0;
  int peak_live_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_pipeline(const TrainerOptions& o, cohort::comm::World& world, c10::Device device) {
  return std::make_unique<PipelineParallel>(o, world, device);
}

}  // namespace fashion_mnist
