#include "cohort/optim/tensor_parallel_parts.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_set>
#include <utility>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/block.h"
#include "cohort/tensor_parallel/embedding.h"
#include "cohort/tensor_parallel/linear.h"

namespace cohort::optim {

namespace {

// Every TP layer's slices must sum over `tp`: a layer over other ranks would be summed
// over the wrong ones (Note [Which groups a norm sums over] in clip_grad_norm.cpp).
void check_group(const comm::Group& layer, const comm::Group& tp, const std::string& name) {
  if (layer.global_ranks() != tp.global_ranks())
    throw ConfigError(fmt::format("cohort tensor_parallel_parts: layer '{}' is split over ranks {}, not over the "
                                  "TP group given (ranks {}); pass the group its layers were built with, or "
                                  "build GradParts for each group yourself",
                                  name, fmt::join(layer.global_ranks(), ","), fmt::join(tp.global_ranks(), ",")));
}

}  // namespace

std::vector<GradPart> tensor_parallel_parts(const torch::nn::Module& model, const comm::Group& tp,
                                            std::vector<comm::Group> also) {
  if (!tp.is_member())
    throw ConfigError("cohort tensor_parallel_parts: this rank is not a member of the TP group given; pass this "
                      "rank's TP group (DeviceMesh::group(MeshDim::kTensor))");
  for (const auto& item : model.named_modules("model", /*include_self=*/true)) {
    const auto* m = item.value().get();
    if (auto* col = dynamic_cast<const tensor_parallel::ColumnParallelLinearImpl*>(m)) {
      check_group(col->group(), tp, item.key());
    } else if (auto* row = dynamic_cast<const tensor_parallel::RowParallelLinearImpl*>(m)) {
      check_group(row->group(), tp, item.key());
    } else if (auto* emb = dynamic_cast<const tensor_parallel::VocabParallelEmbeddingImpl*>(m)) {
      check_group(emb->group(), tp, item.key());
    }
  }
  // replicated_parameters knows which parameters the TP layers slice; the rest are theirs.
  std::vector<at::Tensor> replicated = tensor_parallel::replicated_parameters(model), sliced;
  std::unordered_set<const c10::TensorImpl*> whole;
  for (const auto& p : replicated) whole.insert(p.unsafeGetTensorImpl());
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : model.parameters(/*recurse=*/true))
    if (!whole.count(p.unsafeGetTensorImpl()) && seen.insert(p.unsafeGetTensorImpl()).second) sliced.push_back(p);
  auto over_tp = also;
  over_tp.insert(over_tp.begin(), tp);
  std::vector<GradPart> parts;
  parts.emplace_back(std::move(sliced), std::move(over_tp));
  parts.emplace_back(std::move(replicated), std::move(also));
  return parts;
}

}  // namespace cohort::optim
