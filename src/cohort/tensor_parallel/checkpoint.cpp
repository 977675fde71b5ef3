#include "cohort/tensor_parallel/checkpoint.h"

#include <string>
#include <unordered_map>

#include "cohort/tensor_parallel/embedding.h"
#include "cohort/tensor_parallel/linear.h"

namespace cohort::tensor_parallel {

std::vector<checkpoint::ParameterSplit> parameter_splits(const torch::nn::Module& model) {
  // The layers' parameters by tensor, then named by the model's own walk: the names
  // are the state dict's (a tied parameter gets each of its names).
  std::unordered_map<const c10::TensorImpl*, checkpoint::ParameterSplit> split;
  auto add = [&](const at::Tensor& t, std::int64_t dim, const comm::Group& group) {
    if (t.defined()) split.emplace(t.unsafeGetTensorImpl(), checkpoint::ParameterSplit{"", dim, group});
  };
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* col = dynamic_cast<const ColumnParallelLinearImpl*>(m.get())) {
      add(col->weight, 0, col->group());
      add(col->bias, 0, col->group());
    } else if (auto* row = dynamic_cast<const RowParallelLinearImpl*>(m.get())) {
      add(row->weight, 1, row->group());
    } else if (auto* emb = dynamic_cast<const VocabParallelEmbeddingImpl*>(m.get())) {
      add(emb->weight, 0, emb->group());
    }
  }
  std::vector<checkpoint::ParameterSplit> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    auto it = split.find(item.value().unsafeGetTensorImpl());
    if (it == split.end()) continue;
    auto s = it->second;
    s.name = item.key();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace cohort::tensor_parallel
