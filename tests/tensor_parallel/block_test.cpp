// The TP transformer block on two ranks (threads over one store) against its
// one-process twin in double precision, with and without sequence parallelism; and
// the replicated parameters' gradients, summed over the group under sequence
// parallelism.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/tensor_parallel/block.h"
#include "support/thread_world.h"
#include "tensor_parallel/twins.h"

namespace {

using cohort::comm::World;
using namespace cohort::tensor_parallel;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(TensorParallelBlock, EqualsTheOneProcessBlockWithAndWithoutSequenceParallelism) {
  torch::manual_seed(41);
  cohort::testing::TwinBlock twin(8, 4);
  // Not LayerNorm's initial ones and zeros, so that a missing sum shows.
  {
    torch::NoGradGuard no_grad;
    for (auto* ln : {&twin.ln1, &twin.ln2}) {
      (*ln)->weight.uniform_(0.5, 1.5);
      (*ln)->bias.uniform_(-0.5, 0.5);
    }
  }
  auto x = torch::randn({2, 6, 8}, torch::kDouble).requires_grad_();
  auto y = twin.forward(x);
  y.pow(2).sum().backward();
  for (const bool sp : {false, true}) {
    cohort::testing::run_thread_world(2, [&](World& w) {
      ParallelTransformerBlock block(w.group(), ParallelTransformerBlockOptions(8, 4).sequence_parallel(sp));
      block->to(torch::kDouble);
      cohort::testing::load_twin(block, twin);
      const auto r = w.rank();
      auto input = (sp ? x.detach().chunk(2, 1)[r] : x.detach()).clone().requires_grad_();
      auto out = block(input);
      EXPECT_LT(max_diff(out, sp ? y.detach().chunk(2, 1)[r] : y.detach()), 1e-12) << "sequence_parallel " << sp;
      out.pow(2).sum().backward();
      EXPECT_LT(max_diff(input.grad(), sp ? x.grad().chunk(2, 1)[r] : x.grad()), 1e-12) << "sequence_parallel " << sp;
      // The LayerNorms and the row-parallel biases (attention proj, fc2): 2 + 2 + 2, held whole.
      EXPECT_EQ(replicated_parameters(*block).size(), 6u);
      if (sp) {
        EXPECT_GT(max_diff(block->ln1->weight.grad(), twin.ln1->weight.grad()), 1e-6)
            << "a shard's LayerNorm gradient was already whole: the test proves nothing";
        sum_replicated_gradients(*block, w.group());
      }
      EXPECT_LT(max_diff(block->ln1->weight.grad(), twin.ln1->weight.grad()), 1e-12) << "sequence_parallel " << sp;
      EXPECT_LT(max_diff(block->ln2->bias.grad(), twin.ln2->bias.grad()), 1e-12) << "sequence_parallel " << sp;
      EXPECT_LT(max_diff(block->fc2->bias.grad(), twin.fc2->bias.grad()), 1e-12) << "sequence_parallel " << sp;
      const auto c0 = block->fc1->first_output(), c1 = block->fc1->last_output();
      EXPECT_LT(max_diff(block->fc1->weight.grad(), twin.fc1->weight.grad().slice(0, c0, c1)), 1e-12);
      EXPECT_LT(max_diff(block->fc2->weight.grad(), twin.fc2->weight.grad().slice(1, c0, c1)), 1e-12);
    });
  }
}

}  // namespace
