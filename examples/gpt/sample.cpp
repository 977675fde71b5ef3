#include "sample.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "mixed_precision.h"

namespace gpt {

std::vector<std::string> sample_texts(Strategy& strategy, const Tokenizer& tokenizer, int vocab_size, int eos_id,
                                      const GptTrainerOptions& o, const cohort::comm::World& world,
                                      cohort::comm::DeviceMesh& mesh,
                                      c10::Device device) {
  using cohort::comm::MeshDim;
  auto& tp = mesh.group(MeshDim::kTensor);
  GptPipeline* const pipe = strategy.pipeline();
  // Note [Sampling in lockstep]: who draws the token every rank takes, with a pipeline.
  const int drawer = pipe ? mesh.global_rank(0, mesh.size(MeshDim::kPipeline) - 1, 0) : -1;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed + 7919);
  torch::NoGradGuard no_grad;
  strategy.model().eval();
  std::vector<std::string> texts;
  for (int s = 0; s < o.samples; ++s) {
    std::vector<std::int64_t> tokens{eos_id};
    std::vector<int> produced;
    for (int t = 0; t < o.sample_tokens; ++t) {
      const auto first = tokens.size() > static_cast<std::size_t>(o.context) ? tokens.size() - o.context : 0;
      std::vector<std::int64_t> window(tokens.begin() + static_cast<std::ptrdiff_t>(first), tokens.end());
      const auto last = static_cast<std::int64_t>(window.size()) - 1;
      window.resize(static_cast<std::size_t>(o.context), eos_id);
      auto ids = torch::tensor(window, torch::kInt64).view({1, o.context}).to(device);
      at::Tensor slice;
      if (pipe) {
        auto out = pipe->pipeline().forward({ids});  // under the pipeline's autocast
        if (!out.empty()) slice = out.at(0);         // the last stage's ranks only
      } else {
        auto guard = autocast(o.amp, device);
        slice = strategy.infer(ids);
      }
      std::int64_t next = 0;
      if (slice.defined()) {
        auto row = slice[0][last].to(torch::kFloat).contiguous();
        auto logits = torch::cat(tp.all_gather(row)).cpu().slice(0, 0, vocab_size);  // the padding's rows are no tokens
        logits = logits / o.temperature;
        if (o.top_k > 0 && o.top_k < vocab_size) {
          const auto kth = std::get<0>(logits.topk(o.top_k)).min();
          logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
        }
        next = torch::multinomial(torch::softmax(logits, 0), 1, false, generator).item<std::int64_t>();
      }
      if (pipe) {
        auto token = torch::tensor({next}, torch::dtype(torch::kInt64).device(device));
        world.group().broadcast(token, drawer);
        next = token.cpu().item<std::int64_t>();
      }
      if (next == eos_id) break;
      tokens.push_back(next);
      produced.push_back(static_cast<int>(next));
    }
    texts.push_back(tokenizer.decode(produced));
  }
  strategy.model().train();
  return texts;
}

}  // namespace gpt
