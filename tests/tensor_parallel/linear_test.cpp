// Column- and row-parallel linear layers on two ranks (threads over one store)
// against the whole layers in one process, in double precision: outputs, the
// input's gradient and every parameter's gradient (a slice of the whole one).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/linear.h"
#include "support/thread_world.h"

namespace {

using cohort::comm::World;
using namespace cohort::tensor_parallel;
namespace F = torch::nn::functional;

// The one-process MLP: fc2(gelu(fc1(x))), with its gradients for loss sum(y^2).
struct Whole {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor x, y, x_grad;
  explicit Whole(std::vector<std::int64_t> shape = {3, 4, 8}) {
    torch::manual_seed(7);
    fc1 = torch::nn::Linear(8, 16);
    fc2 = torch::nn::Linear(16, 6);
    fc1->to(torch::kDouble);
    fc2->to(torch::kDouble);
    auto input = torch::randn(shape, torch::kDouble).requires_grad_();
    y = fc2(F::gelu(fc1(input)));
    y.pow(2).sum().backward();
    x = input.detach();
    x_grad = input.grad().clone();
    y = y.detach();
  }
};

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

struct TpMlp {
  ColumnParallelLinear col;
  RowParallelLinear row;
  TpMlp(World& w, const Whole& whole, bool sequence_parallel)
      : col(w.group(), ColumnParallelLinearOptions(8, 16).sequence_parallel(sequence_parallel)),
        row(w.group(), RowParallelLinearOptions(16, 6).sequence_parallel(sequence_parallel)) {
    col->to(torch::kDouble);
    row->to(torch::kDouble);
    col->load_whole(whole.fc1);
    row->load_whole(whole.fc2);
  }
  torch::Tensor operator()(const torch::Tensor& x) { return row(F::gelu(col(x))); }
};

TEST(TensorParallelLinear, ColumnThenRowEqualsTheWholeMlp) {
  const Whole whole;
  cohort::testing::run_thread_world(2, [&](World& w) {
    TpMlp mlp(w, whole, false);
    auto x = whole.x.clone().requires_grad_();
    auto y = mlp(x);
    y.pow(2).sum().backward();
    EXPECT_LT(max_diff(y, whole.y), 1e-12);
    EXPECT_LT(max_diff(x.grad(), whole.x_grad), 1e-12) << "copy_to_tp's backward must sum the ranks' parts";
    const auto c0 = mlp.col->first_output(), c1 = mlp.col->last_output();
    EXPECT_EQ(c1 - c0, 8);
    EXPECT_LT(max_diff(mlp.col->weight.grad(), whole.fc1->weight.grad().slice(0, c0, c1)), 1e-12);
    EXPECT_LT(max_diff(mlp.col->bias.grad(), whole.fc1->bias.grad().slice(0, c0, c1)), 1e-12);
    const auto r0 = mlp.row->first_input(), r1 = mlp.row->last_input();
    EXPECT_LT(max_diff(mlp.row->weight.grad(), whole.fc2->weight.grad().slice(1, r0, r1)), 1e-12);
    EXPECT_LT(max_diff(mlp.row->bias.grad(), whole.fc2->bias.grad()), 1e-12);
  });
}

TEST(TensorParallelLinear, SequenceParallelShardsTheActivationsBetweenBlocks) {
  const Whole whole({3, 4, 8});
  cohort::testing::run_thread_world(2, [&](World& w) {
    TpMlp mlp(w, whole, true);
    const auto r = w.rank();
    auto x = whole.x.chunk(2, kSequenceDim)[r].clone().requires_grad_();
    auto y = mlp(x);
    EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{3, 2, 6}));
    EXPECT_LT(max_diff(y, whole.y.chunk(2, kSequenceDim)[r]), 1e-12);
    // The loss is the sum over the ranks' shards: each rank's shard of it.
    y.pow(2).sum().backward();
    EXPECT_LT(max_diff(x.grad(), whole.x_grad.chunk(2, kSequenceDim)[r]), 1e-12);
    const auto c0 = mlp.col->first_output(), c1 = mlp.col->last_output();
    EXPECT_LT(max_diff(mlp.col->weight.grad(), whole.fc1->weight.grad().slice(0, c0, c1)), 1e-12);
    // The replicated bias saw only this rank's tokens: the ranks' gradients sum to it.
    auto bias_grad = mlp.row->bias.grad().clone();
    w.group().all_reduce(bias_grad);
    EXPECT_LT(max_diff(bias_grad, whole.fc2->bias.grad()), 1e-12);
  });
}

TEST(TensorParallelLinear, GatheredOutputAndScatteredInputEqualTheWholeLayer) {
  const Whole whole;
  cohort::testing::run_thread_world(2, [&](World& w) {
    ColumnParallelLinear col(w.group(), ColumnParallelLinearOptions(8, 16).gather_output(true));
    RowParallelLinear row(w.group(), RowParallelLinearOptions(16, 6).input_is_parallel(false));
    col->to(torch::kDouble);
    row->to(torch::kDouble);
    col->load_whole(whole.fc1);
    row->load_whole(whole.fc2);
    auto x = whole.x.clone().requires_grad_();
    auto hidden = col(x);
    EXPECT_EQ(hidden.size(-1), 16);
    auto y = row(F::gelu(hidden));
    y.pow(2).sum().backward();
    EXPECT_LT(max_diff(y, whole.y), 1e-12);
    EXPECT_LT(max_diff(x.grad(), whole.x_grad), 1e-12);
  });
}

// Note [Whole, then sliced] in linear.cpp: each rank, seeded alike, holds its slice of
// the layer a one-process model draws, and leaves the generator where that model does.
TEST(TensorParallelLinear, BuiltFromTheSameSeedTheShardsAreTheOneProcessLayer) {
  torch::manual_seed(11);
  torch::nn::Linear reference(8, 16);
  const auto next_draw = torch::rand({1});
  std::vector<torch::Tensor> rows(2), biases(2), after(2);
  std::mutex generator;  // one process-wide generator: the ranks take turns
  cohort::testing::run_thread_world(2, [&](World& w) {
    std::lock_guard<std::mutex> turn(generator);
    torch::manual_seed(11);
    ColumnParallelLinear col(w.group(), ColumnParallelLinearOptions(8, 16));
    rows[w.rank()] = col->weight.detach().clone();
    biases[w.rank()] = col->bias.detach().clone();
    after[w.rank()] = torch::rand({1});
  });
  EXPECT_TRUE(torch::equal(torch::cat(rows, 0), reference->weight.detach()));
  EXPECT_TRUE(torch::equal(torch::cat(biases, 0), reference->bias.detach()));
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(torch::equal(after[r], next_draw)) << "rank " << r;
}

TEST(TensorParallelLinear, SizesTheGroupCannotSplitAreRefusedNamingThem) {
  cohort::testing::run_thread_world(2, [&](World& w) {
    try {
      ColumnParallelLinear bad(w.group(), ColumnParallelLinearOptions(8, 15));
      ADD_FAILURE() << "15 outputs over 2 ranks were accepted";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("out_features is 15"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("multiple of the TP size"), std::string::npos) << e.what();
    }
    RowParallelLinear row(w.group(), RowParallelLinearOptions(16, 6));
    try {
      row(torch::zeros({2, 16}));  // the whole input, not this rank's slice
      ADD_FAILURE() << "a whole input was taken for a slice";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("input_is_parallel(false)"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
