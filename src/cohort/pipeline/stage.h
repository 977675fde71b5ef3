#pragma once
// One stage of a pipeline: the part of the model one rank runs, as a module (for its
// parameters, buffers, train()/eval() and saving) and a forward over lists of tensors
// (a stage may take and return several).
//
//   // From a Sequential cut by split.h: one tensor in, one out.
//   auto parts = cohort::pipeline::split_by_balance(model, {3, 5});
//   cohort::pipeline::PipelineStage stage(parts[rank], /*index=*/rank);
//
//   // Written by hand: any module and any forward.
//   auto head = std::make_shared<MyHead>();
//   cohort::pipeline::PipelineStage stage(head, /*index=*/1,
//       [head](const cohort::pipeline::TensorList& in) { return cohort::pipeline::TensorList{head->forward(in[0], in[1])}; });
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cohort::pipeline {

using TensorList = std::vector<at::Tensor>;
using StageForward = std::function<TensorList(const TensorList&)>;

class PipelineStage {
 public:
  // A Sequential part: forward takes one tensor and returns one. Its layers keep
  // their names in the whole model (split.h), so state dicts assemble by name.
  PipelineStage(torch::nn::Sequential part, int index);
  // Any module with its own forward. Its state appears under "<state_prefix>." in the
  // whole model's state dict (pipeline.h's full_state_dict); an empty prefix means
  // "stage<index>".
  PipelineStage(std::shared_ptr<torch::nn::Module> module, int index, StageForward forward,
                std::string state_prefix = "");

  int index() const { return index_; }
  TensorList forward(const TensorList& inputs) const { return forward_(inputs); }
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  // The children under which this stage's parameters and buffers appear in the whole
  // model's state dict: (name, module) pairs.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> state_children() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  int index_;
  StageForward forward_;
  bool flatten_;  // a Sequential part: its children carry the whole model's names
  std::string prefix_;
};

}  // namespace cohort::pipeline
