#include "clipping.h"

#include <algorithm>

#include "cohort/optim/tensor_parallel_parts.h"

namespace gpt {

namespace {

// Note [The tied copy counts once]: with stages > 1 the last stage's copy of the
// token embedding has, after sum_tied_gradients, the same gradient as stage 0's
// table: the whole model has one table, so only stage 0's is counted. The copy is
// still scaled, by the same coefficient, in a part that is not counted
// (GradPart::counted), and so stays equal to the table.
void drop(std::vector<cohort::optim::GradPart>& parts, const std::vector<at::Tensor>& left_out) {
  for (auto& part : parts) {
    auto& p = part.parameters;
    p.erase(std::remove_if(p.begin(), p.end(),
                           [&](const at::Tensor& t) {
                             return std::any_of(left_out.begin(), left_out.end(),
                                                [&](const at::Tensor& l) { return l.is_same(t); });
                           }),
            p.end());
  }
}

}  // namespace

std::vector<cohort::optim::GradPart> clipping_parts(const GptTrainerOptions& o, Strategy& strategy,
                                                    cohort::comm::DeviceMesh& mesh) {
  using cohort::comm::MeshDim;
  if (o.clip_grad_norm <= 0) return {};
  if (const auto* sharded = strategy.fully_sharded())
    return {cohort::optim::GradPart(sharded->parameters(), {mesh.group(MeshDim::kData)})};
  const auto& tp = mesh.group(MeshDim::kTensor);
  if (auto* pipe = strategy.pipeline()) {
    auto parts = cohort::optim::tensor_parallel_parts(*pipe->stage(), tp, {mesh.group(MeshDim::kPipeline)});
    const auto& stage = pipe->stage();
    if (stage->output) {
      drop(parts, stage->output->parameters());
      parts.emplace_back(stage->output->parameters(), std::vector<cohort::comm::Group>{}, /*counted=*/false);
    }
    return parts;
  }
  return cohort::optim::tensor_parallel_parts(strategy.model(), tp);
}

}  // namespace gpt
