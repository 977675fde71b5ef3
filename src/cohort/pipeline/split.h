#pragma once
// Cutting a torch::nn::Sequential into consecutive parts, one per pipeline stage. The
// parts share the original layers (no copies) and keep their names, so the parts'
// state dicts together are the whole model's.
//
//   auto parts = split_by_balance(model, {2, 3});          // layers per stage
//   auto parts = split_by_parameters(model, 4);            // about equal parameter counts
//   auto parts = split_at(model, {"fc1"});                 // a new stage starts at "fc1"
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

namespace cohort::pipeline {

std::vector<torch::nn::Sequential> split_by_balance(const torch::nn::Sequential& model, const std::vector<int>& balance);

// A balance with `stages` parts of consecutive layers whose parameter counts are as
// even as they can be (the largest part as small as possible); every part gets at
// least one layer.
std::vector<int> balance_by_parameters(const torch::nn::Sequential& model, int stages);
std::vector<torch::nn::Sequential> split_by_parameters(const torch::nn::Sequential& model, int stages);

// Each name is a layer of `model` that starts a new stage, in order.
std::vector<torch::nn::Sequential> split_at(const torch::nn::Sequential& model,
                                            const std::vector<std::string>& split_points);

}  // namespace cohort::pipeline
