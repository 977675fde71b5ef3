// Head-split self-attention and one-process dropout on two ranks (threads over one
// store) against the one-process twin, in double precision.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/attention.h"
#include "cohort/tensor_parallel/dropout.h"
#include "support/thread_world.h"
#include "tensor_parallel/twins.h"

namespace {

using cohort::comm::World;
using namespace cohort::tensor_parallel;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(TensorParallelAttention, HeadsSplitOverTwoRanksEqualTheWholeAttention) {
  torch::manual_seed(21);
  cohort::testing::TwinAttention twin(8, 4);
  auto x = torch::randn({2, 6, 8}, torch::kDouble).requires_grad_();
  auto y = twin.forward(x);
  y.pow(2).sum().backward();
  for (const bool sp : {false, true}) {
    cohort::testing::run_thread_world(2, [&](World& w) {
      ParallelSelfAttention attn(w.group(), ParallelSelfAttentionOptions(8, twin.heads).sequence_parallel(sp));
      attn->to(torch::kDouble);
      attn->load_whole(twin.q, twin.k, twin.v, twin.proj);
      const auto r = w.rank();
      auto input = (sp ? x.detach().chunk(2, 1)[r] : x.detach()).clone().requires_grad_();
      auto out = attn(input);
      EXPECT_LT(max_diff(out, sp ? y.detach().chunk(2, 1)[r] : y.detach()), 1e-12) << "sequence_parallel " << sp;
      out.pow(2).sum().backward();
      EXPECT_LT(max_diff(input.grad(), sp ? x.grad().chunk(2, 1)[r] : x.grad()), 1e-12) << "sequence_parallel " << sp;
      const auto c0 = attn->query->first_output(), c1 = attn->query->last_output();
      EXPECT_LT(max_diff(attn->query->weight.grad(), twin.q->weight.grad().slice(0, c0, c1)), 1e-12);
      EXPECT_LT(max_diff(attn->value->weight.grad(), twin.v->weight.grad().slice(0, c0, c1)), 1e-12);
      EXPECT_LT(max_diff(attn->proj->weight.grad(), twin.proj->weight.grad().slice(1, c0, c1)), 1e-12);
    });
  }
}

// Counts the collectives of every group of the world, by name.
class CountingRecorder : public cohort::comm::Recorder {
 public:
  bool recording() const override { return true; }
  void span(std::string, const char*, double, double, std::int64_t) override {}
  void instant(std::string, const char*, double, std::int64_t) override {}
  void async(std::string name, const char*, double, double, std::int64_t) override {
    std::lock_guard<std::mutex> lock(mutex);
    ++counts[name];
  }
  int count(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex);
    return counts[name];
  }
  // Reductions: Gloo has no reduce-scatter, and Group runs it as an all-reduce.
  int reductions() { return count("all_reduce") + count("reduce_scatter"); }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    counts.clear();
  }

 private:
  std::mutex mutex;
  std::map<std::string, int> counts;
};

// Megatron's cost: one collective before the heads and one after in each direction,
// the query, key and value projections sharing the input's (input_is_gathered).
TEST(TensorParallelAttention, OneCollectiveForTheThreeProjectionsInEachDirection) {
  for (const bool sp : {false, true}) {
    std::array<std::shared_ptr<CountingRecorder>, 2> recorders{std::make_shared<CountingRecorder>(),
                                                              std::make_shared<CountingRecorder>()};
    auto options = cohort::testing::quick_thread_world_options().recorder(
        [&](cohort::comm::Group&, int rank, c10::Device) { return recorders[rank]; });
    cohort::testing::run_thread_world(
        2,
        [&](World& w) {
          ParallelSelfAttention attn(w.group(), ParallelSelfAttentionOptions(8, 4).sequence_parallel(sp));
          auto x = torch::randn({2, sp ? 3 : 6, 8}).requires_grad_();
          auto& mine = *recorders[w.rank()];
          mine.clear();
          auto y = attn(x);
          // Forward: the input's gather (under sequence parallelism; copy_to_tp moves
          // nothing) and the projection's reduce.
          EXPECT_EQ(mine.count("all_gather"), sp ? 1 : 0) << "forward, sequence_parallel " << sp;
          EXPECT_EQ(mine.reductions(), 1) << "forward, sequence_parallel " << sp;
          mine.clear();
          y.sum().backward();
          // Backward: the projection's conjugate (an all-gather, or nothing) and the
          // input's (a reduce-scatter, or an all-reduce), once each.
          EXPECT_EQ(mine.reductions(), 1) << "backward, sequence_parallel " << sp;
          EXPECT_EQ(mine.count("all_gather"), sp ? 1 : 0) << "backward, sequence_parallel " << sp;
        },
        options);
  }
}

TEST(TensorParallelAttention, HeadsThatDoNotSplitAreRefused) {
  cohort::testing::run_thread_world(2, [&](World& w) {
    try {
      ParallelSelfAttention odd(w.group(), ParallelSelfAttentionOptions(9, 3));
      ADD_FAILURE() << "3 heads over 2 ranks were accepted";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("num_heads is 3"), std::string::npos) << e.what();
    }
  });
}

// Note [Dropout as one process draws it]: each rank's chunk of its mask is the chunk
// of the mask one process draws from the same seed, and the generator ends where the
// one process's does. The ranks take turns on the process-wide generator.
TEST(TensorParallelDropout, EachRanksMaskIsItsChunkOfTheOneProcessMask) {
  auto x = torch::randn({2, 4, 6});
  torch::manual_seed(31);
  auto whole = torch::dropout(x, 0.4, true);
  auto next = torch::rand({1});
  std::vector<torch::Tensor> chunks(2), after(2);
  std::mutex generator;
  cohort::testing::run_thread_world(2, [&](World& w) {
    std::lock_guard<std::mutex> turn(generator);
    torch::manual_seed(31);
    chunks[w.rank()] = sharded_dropout(x.chunk(2, 1)[w.rank()], 0.4, true, w.group(), 1);
    after[w.rank()] = torch::rand({1});
  });
  EXPECT_TRUE(torch::equal(torch::cat(chunks, 1), whole));
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(torch::equal(after[r], next)) << "rank " << r;
  EXPECT_GT(whole.eq(0).sum().item<int>(), 0) << "p = 0.4 dropped nothing: the test proves nothing";
}

}  // namespace
