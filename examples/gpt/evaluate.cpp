#include "evaluate.h"

#include <torch/torch.h>

#include <cmath>

#include "batches.h"
#include "mixed_precision.h"

namespace gpt {

double Evaluation::perplexity() const { return std::exp(loss); }

Evaluation evaluate(Strategy& strategy, const std::vector<std::int32_t>& validation, const GptTrainerOptions& o,
                    cohort::comm::DeviceMesh& mesh, c10::Device device) {
  using cohort::comm::MeshDim;
  auto& data = mesh.group(MeshDim::kData);
  torch::NoGradGuard no_grad;
  strategy.model().eval();
  double loss_sum = 0, rows = 0;
  for (std::int64_t b = 0; b < o.eval_batches; ++b) {
    auto batch = validation_batch(validation, b, o.batch_size, o.context, data.rank(), data.size());
    at::Tensor logits;
    if (auto* pipe = strategy.pipeline()) {
      // Under the pipeline's own autocast; only the last stage gets the logits.
      auto out = pipe->pipeline().forward({batch.inputs.to(device)});
      if (out.empty()) continue;
      logits = out.at(0);
    } else {
      auto guard = autocast(o.amp, device);
      logits = strategy.infer(batch.inputs.to(device));
    }
    const auto n = static_cast<double>(batch.inputs.size(0));
    loss_sum += strategy.gpt().loss(logits.to(torch::kFloat), batch.targets.to(device)).item<double>() * n;
    rows += n;
  }
  strategy.model().train();
  auto sums = torch::tensor({loss_sum, rows}, torch::dtype(torch::kFloat64).device(device));
  data.all_reduce(sums);
  // With a pipeline only the last stage counted: the sum over the stages is its.
  if (strategy.pipeline()) mesh.group(MeshDim::kPipeline).all_reduce(sums);
  auto cpu = sums.cpu();
  return {cpu[0].item<double>() / cpu[1].item<double>()};
}

}  // namespace gpt
