// Note [Fused attention and sharded dropout]: the kernel each LibTorch and mode runs,
// and the fused kernel (scaled_dot_product_attention, LibTorch 2.x) against the
// explicit attention and the one-process twin, on the CPU: outputs and gradients,
// causal or not, several head counts, one and two TP ranks (threads over one store).
// On LibTorch 1.13 the same comparisons prove that `automatic` runs the explicit
// attention and that it is right; nothing is skipped.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <string>
#include <vector>

#include "cohort/compat/attention.h"
#include "cohort/errors.h"
#include "cohort/tensor_parallel/attention.h"
#include "support/thread_world.h"

namespace {

using cohort::comm::World;
using namespace cohort::tensor_parallel;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// What `automatic` becomes where LibTorch has the fused kernel, else math.
AttentionKernel fused_if_any() {
  return cohort::compat::kHasScaledDotProductAttention ? AttentionKernel::fused : AttentionKernel::math;
}

TEST(AttentionKernel, AutomaticIsFusedWhereLibTorchHasItAndNoDropoutIsDrawn) {
  EXPECT_EQ(resolve_attention_kernel(AttentionKernel::automatic, 0.0, true), fused_if_any());
  EXPECT_EQ(resolve_attention_kernel(AttentionKernel::automatic, 0.2, false), fused_if_any());
  EXPECT_EQ(resolve_attention_kernel(AttentionKernel::automatic, 0.2, true), AttentionKernel::math);
  EXPECT_EQ(resolve_attention_kernel(AttentionKernel::math, 0.0, false), AttentionKernel::math);
  EXPECT_EQ(cohort::compat::kHasScaledDotProductAttention, TORCH_VERSION_MAJOR >= 2);
}

TEST(AttentionKernel, FusedIsRefusedWhereItCannotRun) {
  const auto fused = [](double dropout) { return resolve_attention_kernel(AttentionKernel::fused, dropout, true); };
  if (cohort::compat::kHasScaledDotProductAttention) {
    EXPECT_EQ(fused(0.0), AttentionKernel::fused);
  } else {
    try {
      fused(0.0);
      ADD_FAILURE() << "AttentionKernel::fused was accepted on LibTorch " << TORCH_VERSION;
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("2.0 or newer"), std::string::npos) << e.what();
    }
  }
  try {
    cohort::testing::run_thread_world(1, [&](World& w) {
      ParallelSelfAttention(w.group(), ParallelSelfAttentionOptions(8, 2).dropout(0.1).kernel(AttentionKernel::fused));
    });
    ADD_FAILURE() << "AttentionKernel::fused with dropout 0.1 was accepted";
  } catch (const cohort::ConfigError& e) {
    const auto why = cohort::compat::kHasScaledDotProductAttention ? "dropout 0.1" : "2.0 or newer";
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

// The module's choice follows its mode: a training run with dropout takes the
// explicit path (sharded_dropout's masks), its eval() the fused kernel.
TEST(AttentionKernel, TheModuleSwitchesWithItsMode) {
  cohort::testing::run_thread_world(1, [&](World& w) {
    ParallelSelfAttention dropping(w.group(), ParallelSelfAttentionOptions(8, 2).dropout(0.1));
    EXPECT_EQ(dropping->kernel(), AttentionKernel::math);
    dropping->eval();
    EXPECT_EQ(dropping->kernel(), fused_if_any());
    ParallelSelfAttention forced(w.group(), ParallelSelfAttentionOptions(8, 2).kernel(AttentionKernel::math));
    EXPECT_EQ(forced->kernel(), AttentionKernel::math);
  });
}

struct Run {
  torch::Tensor out, input_grad, query_grad, value_grad, proj_grad;
};

// One forward and backward of attention over `world` ranks with `kernel`, from the
// same weights (`whole`'s four layers) and input, gathered back to whole tensors.
Run run(int world, AttentionKernel kernel, const std::vector<torch::nn::Linear>& whole, const torch::Tensor& x,
        std::int64_t heads, bool causal) {
  const auto h = x.size(2);
  std::vector<Run> ranks(world);
  cohort::testing::run_thread_world(world, [&](World& w) {
    ParallelSelfAttention attn(w.group(), ParallelSelfAttentionOptions(h, heads).causal(causal).kernel(kernel));
    attn->to(x.scalar_type());
    attn->load_whole(whole[0], whole[1], whole[2], whole[3]);
    // `automatic` is what the GPT example runs: it must be the fused kernel here.
    EXPECT_EQ(attn->kernel(), kernel == AttentionKernel::math ? AttentionKernel::math : fused_if_any());
    auto input = x.detach().clone().requires_grad_();
    auto out = attn(input);
    out.pow(2).sum().backward();
    ranks[w.rank()] = {out.detach(), input.grad(), attn->query->weight.grad(), attn->value->weight.grad(),
                       attn->proj->weight.grad()};
  });
  Run r = ranks[0];
  std::vector<torch::Tensor> q, v, p;
  for (auto& one : ranks) {
    q.push_back(one.query_grad);
    v.push_back(one.value_grad);
    p.push_back(one.proj_grad);
  }
  r.query_grad = torch::cat(q, 0);  // column-parallel: output rows
  r.value_grad = torch::cat(v, 0);
  r.proj_grad = torch::cat(p, 1);  // row-parallel: input columns
  return r;
}

void expect_near(const Run& a, const Run& b, double tolerance, const std::string& what) {
  EXPECT_LT(max_diff(a.out, b.out), tolerance) << "output, " << what;
  EXPECT_LT(max_diff(a.input_grad, b.input_grad), tolerance) << "input's gradient, " << what;
  EXPECT_LT(max_diff(a.query_grad, b.query_grad), tolerance) << "query's weight gradient, " << what;
  EXPECT_LT(max_diff(a.value_grad, b.value_grad), tolerance) << "value's weight gradient, " << what;
  EXPECT_LT(max_diff(a.proj_grad, b.proj_grad), tolerance) << "proj's weight gradient, " << what;
}

// The one-process reference, with torch's own modules and autograd.
Run twin(std::vector<torch::nn::Linear> l, const torch::Tensor& x, std::int64_t heads, bool causal) {
  const std::int64_t b = x.size(0), s = x.size(1), h = x.size(2), hd = h / heads;
  auto input = x.detach().clone().requires_grad_();
  auto split = [&](const torch::Tensor& t) { return t.view({b, s, heads, hd}).transpose(1, 2); };
  auto scores = torch::matmul(split(l[0](input)), split(l[1](input)).transpose(-2, -1)) / std::sqrt(double(hd));
  if (causal) scores = scores.masked_fill(torch::ones({s, s}, torch::kBool).triu(1), -INFINITY);
  auto out = l[3](torch::matmul(torch::softmax(scores, -1), split(l[2](input))).transpose(1, 2).reshape({b, s, h}));
  out.pow(2).sum().backward();
  return {out.detach(), input.grad(), l[0]->weight.grad(), l[2]->weight.grad(), l[3]->weight.grad()};
}

TEST(AttentionKernel, FusedEqualsTheExplicitAttentionAndTheTwin) {
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    const double tolerance = dtype == torch::kDouble ? 1e-10 : 2e-4;
    for (const bool causal : {true, false}) {
      for (const std::int64_t heads : {1, 2, 4, 8}) {
        torch::manual_seed(40 + heads);
        std::vector<torch::nn::Linear> whole;
        for (int i = 0; i < 4; ++i) {
          whole.emplace_back(16, 16);
          whole.back()->to(dtype);
        }
        auto x = torch::randn({2, 7, 16}, dtype);
        const auto reference = twin(whole, x, heads, causal);
        for (const int world : {1, 2}) {
          if (heads % world != 0) continue;
          const auto what = std::string(c10::toString(dtype)) + ", causal " + std::to_string(causal) + ", " +
                            std::to_string(heads) + " heads, TP " + std::to_string(world);
          const auto math = run(world, AttentionKernel::math, whole, x, heads, causal);
          const auto automatic = run(world, AttentionKernel::automatic, whole, x, heads, causal);
          expect_near(math, reference, tolerance, "math against the twin, " + what);
          expect_near(automatic, reference, tolerance, "automatic against the twin, " + what);
          expect_near(automatic, math, tolerance, "automatic against math, " + what);
        }
      }
    }
  }
}

}  // namespace
