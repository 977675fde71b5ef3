#include "cohort/pipeline/stage.h"

#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::pipeline {

PipelineStage::PipelineStage(torch::nn::Sequential part, int index)
    : module_(part.ptr()), index_(index), flatten_(true) {
  if (part->is_empty())
    throw ConfigError(fmt::format("cohort pipeline: stage {} is an empty Sequential; give every stage at least "
                                  "one layer (fewer stages, or another balance)",
                                  index));
  forward_ = [part](const TensorList& in) mutable {
    if (in.size() != 1)
      throw ConfigError(fmt::format("cohort pipeline: a Sequential stage takes one tensor, got {}; write the stage "
                                    "by hand (PipelineStage(module, index, forward)) to pass several",
                                    in.size()));
    return TensorList{part->forward(in[0])};
  };
}

PipelineStage::PipelineStage(std::shared_ptr<torch::nn::Module> module, int index, StageForward forward,
                             std::string state_prefix)
    : module_(std::move(module)), index_(index), forward_(std::move(forward)), flatten_(false),
      prefix_(std::move(state_prefix)) {
  if (!module_) throw ConfigError(fmt::format("cohort pipeline: stage {}'s module is null", index));
  if (!forward_) throw ConfigError(fmt::format("cohort pipeline: stage {}'s forward is empty", index));
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> PipelineStage::state_children() const {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  if (flatten_) {
    for (const auto& item : module_->named_children()) out.emplace_back(item.key(), item.value());
  } else {
    out.emplace_back(prefix_.empty() ? fmt::format("stage{}", index_) : prefix_, module_);
  }
  return out;
}

}  // namespace cohort::pipeline
