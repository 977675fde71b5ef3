// Pipeline's construction: the ranks' agreement on the schedule, data_parallel()
// and the small accessors. The step is in pipeline_step.cpp, the actions it runs in
// pipeline_actions.cpp, and full_state_dict() in pipeline_state.cpp.
#include "cohort/pipeline/pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"

namespace cohort::pipeline {

Pipeline::Pipeline(std::vector<PipelineStage> stages, comm::Group group, PipelineOptions options)
    : stages_(std::move(stages)), group_(std::move(group)), options_(std::move(options)) {
  if (!group_.is_member())
    throw ConfigError("cohort pipeline: this rank is not a member of the pipeline group it was given");
  if (!options_.loss()) throw ConfigError("cohort pipeline: PipelineOptions needs a loss function");
  rank_ = group_.rank();
  check_agreement();
  schedule_ = make_schedule(ScheduleOptions()
                                .kind(options_.schedule())
                                .ranks(group_.size())
                                .microbatches(options_.microbatches())
                                .virtual_stages(options_.virtual_stages()));
  simulated_ = simulate(schedule_);  // throws if the lists would deadlock
  local_module_ = std::make_shared<torch::nn::Module>("PipelineStages");
  for (const auto& stage : stages_) {
    for (const auto& [name, child] : stage.state_children()) local_module_->register_module(name, child);
  }
}

Pipeline::~Pipeline() = default;
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;

// Every rank must agree on the schedule before the first message, or ranks would
// wait for messages that never come. One all_gather of fixed-size settings tells
// every rank what every other has, so all refuse together, naming the differences.
void Pipeline::check_agreement() {
  constexpr int kMaxChunks = 16;
  const int p = group_.size();
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(options_.schedule()), options_.microbatches(),
                                 options_.virtual_stages(), options_.recompute() ? 1 : 0,
                                 static_cast<std::int64_t>(stages_.size())};
  for (int c = 0; c < kMaxChunks; ++c)
    mine.push_back(c < static_cast<int>(stages_.size()) ? stages_[c].index() : -1);
  auto t = at::tensor(mine, at::TensorOptions().dtype(at::kLong)).to(options_.device());
  auto all = group_.all_gather(t);
  auto describe = [&](const at::Tensor& x) {
    auto v = x.cpu();
    auto* d = v.data_ptr<std::int64_t>();
    std::vector<std::int64_t> idx;
    for (int c = 0; c < std::min<std::int64_t>(d[4], kMaxChunks); ++c) idx.push_back(d[5 + c]);
    return fmt::format("schedule {}, {} micro-batches, {} virtual stages, recompute {}, stages [{}]",
                       to_string(static_cast<ScheduleKind>(d[0])), d[1], d[2], d[3] ? "on" : "off",
                       fmt::join(idx, ", "));
  };
  std::vector<std::string> problems;
  const auto reference = all[0].cpu();
  for (int r = 0; r < p; ++r) {
    auto v = all[r].cpu();
    auto* d = v.data_ptr<std::int64_t>();
    bool same = at::equal(v.narrow(0, 0, 4), reference.narrow(0, 0, 4));
    bool placed = d[4] == d[2] && d[4] <= kMaxChunks;
    for (int c = 0; placed && c < d[4]; ++c) placed = d[5 + c] == r + c * p;
    if (!same || !placed) problems.push_back(fmt::format("pipeline rank {}: {}", r, describe(all[r])));
  }
  if (!problems.empty())
    throw ConfigError(fmt::format(
        "cohort pipeline: the ranks of pipeline group '{}' disagree. Each must pass the same schedule, micro-batch "
        "count, virtual stages and recompute setting, and pipeline rank r must hold stages r, r+{}, ... (one per "
        "virtual stage). Rank 0 has: {}; these differ: {}. Fix the flags or the stage assignment so every rank "
        "agrees",
        group_.name(), p, describe(all[0]), fmt::join(problems, "; ")));
  if (options_.virtual_stages() != static_cast<int>(stages_.size()))
    throw ConfigError(fmt::format("cohort pipeline: {} virtual stages but this rank passed {} stages; pass one "
                                  "stage per virtual stage",
                                  options_.virtual_stages(), stages_.size()));
}

void Pipeline::data_parallel(comm::Group data_group, ddp::DistributedDataParallelOptions options) {
  if (data_parallel_) throw ConfigError("cohort pipeline: data_parallel() was already called");
  // A stage with nothing to train (a reshape, an activation) has no gradients to
  // reduce: it gets no DDP, on every replica alike, since they hold the same stages.
  for (const auto& stage : stages_) {
    const auto params = stage.module()->parameters();
    const bool trainable = std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.requires_grad(); });
    ddp_.push_back(trainable ? std::make_unique<ddp::DistributedDataParallelBase>(stage.module(), data_group, options)
                             : nullptr);
  }
  data_parallel_ = true;
}

bool Pipeline::is_first() const { return rank_ == schedule_.rank_of(0); }
bool Pipeline::is_last() const { return rank_ == schedule_.rank_of(schedule_.stages() - 1); }

int Pipeline::local_index(int stage) const {
  TORCH_INTERNAL_ASSERT(schedule_.rank_of(stage) == rank_, "stage ", stage, " is not on pipeline rank ", rank_);
  return schedule_.chunk_of(stage);
}

std::vector<at::Tensor> Pipeline::parameters() const { return local_module_->parameters(); }
std::shared_ptr<torch::nn::Module> Pipeline::local_module() const { return local_module_; }

std::unique_ptr<amp::Autocast> Pipeline::autocast() const {
  return options_.autocast() ? std::make_unique<amp::Autocast>(*options_.autocast()) : nullptr;
}

}  // namespace cohort::pipeline
