// The vocabulary-parallel embedding and cross-entropy on two ranks (threads over one
// store) against torch::nn::Embedding and cross_entropy in one process, in double.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/cross_entropy.h"
#include "cohort/tensor_parallel/embedding.h"
#include "support/thread_world.h"

namespace {

using cohort::comm::World;
using namespace cohort::tensor_parallel;
namespace F = torch::nn::functional;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(VocabParallel, EmbeddingEqualsTheWholeTable) {
  torch::manual_seed(3);
  torch::nn::Embedding whole(10, 4);
  whole->to(torch::kDouble);
  auto ids = torch::randint(0, 10, {3, 6}, torch::kLong);
  auto coef = torch::randn({3, 6, 4}, torch::kDouble);
  auto y = whole(ids);
  (y * coef).sum().backward();
  cohort::testing::run_thread_world(2, [&](World& w) {
    VocabParallelEmbedding emb(w.group(), VocabParallelEmbeddingOptions(10, 4));
    emb->to(torch::kDouble);
    emb->load_whole(whole);
    auto out = emb(ids);
    EXPECT_LT(max_diff(out, y.detach()), 1e-12);
    (out * coef).sum().backward();
    EXPECT_LT(max_diff(emb->weight.grad(), whole->weight.grad().slice(0, emb->first_row(), emb->last_row())), 1e-12);
  });
}

TEST(VocabParallel, CrossEntropyEqualsTheWholeLogitsWithIgnoredTargets) {
  torch::manual_seed(5);
  auto logits = (3 * torch::randn({3, 5, 10}, torch::kDouble)).requires_grad_();
  auto targets = torch::randint(0, 10, {3, 5}, torch::kLong);
  targets[0][1] = -100;
  targets[2][4] = -100;
  auto loss = F::cross_entropy(logits.reshape({-1, 10}), targets.reshape({-1}),
                               F::CrossEntropyFuncOptions().ignore_index(-100));
  loss.backward();
  cohort::testing::run_thread_world(2, [&](World& w) {
    auto mine = logits.detach().chunk(2, -1)[w.rank()].clone().requires_grad_();
    auto tp_loss = vocab_parallel_cross_entropy(mine, targets, w.group());
    EXPECT_LT(std::abs(tp_loss.item<double>() - loss.item<double>()), 1e-12);
    tp_loss.backward();
    EXPECT_LT(max_diff(mine.grad(), logits.grad().chunk(2, -1)[w.rank()]), 1e-12);
  });
}

// Tied embeddings: the output layer is the embedding's table, split the same way, so
// the logits come out vocabulary-parallel and are never gathered. (A plain
// matmul(hidden, weight.t()) here gave each rank only its part of the hidden state's
// gradient: the table's gradient was off by 0.1, hence logits().)
TEST(VocabParallel, TiedEmbeddingAndLossEqualOneProcess) {
  torch::manual_seed(9);
  torch::nn::Embedding whole(8, 6);
  whole->to(torch::kDouble);
  auto ids = torch::randint(0, 8, {2, 4}, torch::kLong);
  auto targets = torch::randint(0, 8, {2, 4}, torch::kLong);
  auto hidden = torch::tanh(whole(ids));
  auto loss = F::cross_entropy(torch::matmul(hidden, whole->weight.t()).reshape({-1, 8}), targets.reshape({-1}));
  loss.backward();
  cohort::testing::run_thread_world(2, [&](World& w) {
    VocabParallelEmbedding emb(w.group(), VocabParallelEmbeddingOptions(8, 6));
    emb->to(torch::kDouble);
    emb->load_whole(whole);
    auto logits = emb->logits(torch::tanh(emb(ids)));
    EXPECT_EQ(logits.size(-1), 4);
    auto tp_loss = vocab_parallel_cross_entropy(logits, targets, w.group());
    EXPECT_LT(std::abs(tp_loss.item<double>() - loss.item<double>()), 1e-12);
    tp_loss.backward();
    EXPECT_LT(max_diff(emb->weight.grad(), whole->weight.grad().slice(0, emb->first_row(), emb->last_row())), 1e-12);
  });
}

TEST(VocabParallel, MisshapenInputsAreRefusedNamingThem) {
  cohort::testing::run_thread_world(2, [&](World& w) {
    try {
      VocabParallelEmbedding odd(w.group(), VocabParallelEmbeddingOptions(9, 4));
      ADD_FAILURE() << "9 rows over 2 ranks were accepted";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("num_embeddings is 9"), std::string::npos) << e.what();
    }
    try {
      vocab_parallel_cross_entropy(torch::zeros({2, 3, 4}), torch::zeros({2, 4}, torch::kLong), w.group());
      ADD_FAILURE() << "targets of another shape were accepted";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("targets of shape [2, 4] do not match logits of shape [2, 3, 4]"),
                std::string::npos)
          << e.what();
    }
  });
}

// Note [Ids outside the vocabulary] (vocab_range.h): no rank holds them, so they
// read as zero rows and target logits of 0 unless refused; PyTorch refuses both.
// On the CPU every rank refuses alike, before any collective; on CUDA it is a
// device-side assert, without the host sync a message would cost each step.
TEST(VocabParallel, IdsAndTargetsOutsideTheVocabularyAreRefusedNamingThem) {
  cohort::testing::run_thread_world(2, [&](World& w) {
    VocabParallelEmbedding emb(w.group(), VocabParallelEmbeddingOptions(8, 4));
    for (const std::int64_t id : {8, 100, -3}) {
      try {
        emb(torch::tensor(std::vector<std::int64_t>{0, 3, id, 7}).view({1, 4}));
        ADD_FAILURE() << "id " << id << " of a vocabulary of 8 was accepted";
      } catch (const cohort::ConfigError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("VocabParallelEmbedding: token id " + std::to_string(id) +
                            " is outside the vocabulary [0, 8) (rank " + std::to_string(w.rank())),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("another tokenizer or vocabulary size"), std::string::npos) << what;
      }
    }
    EXPECT_EQ(emb(torch::tensor({0, 7}, torch::kLong).view({1, 2})).size(-1), 4);  // the ends are in

    auto logits = torch::randn({1, 3, 4}, torch::kDouble);  // this rank's half of 8
    for (const std::int64_t target : {8, -5}) {
      try {
        vocab_parallel_cross_entropy(logits, torch::tensor(std::vector<std::int64_t>{1, target, 2}).view({1, 3}),
                                     w.group());
        ADD_FAILURE() << "target " << target << " of a vocabulary of 8 was accepted";
      } catch (const cohort::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("vocab_parallel_cross_entropy: target " + std::to_string(target) +
                                             " is outside the vocabulary [0, 8)"),
                  std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("and not the ignore_index -100"), std::string::npos) << e.what();
      }
    }
    // ignore_index and the vocabulary's ends are in.
    auto loss = vocab_parallel_cross_entropy(logits, torch::tensor({0, -100, 7}, torch::kLong).view({1, 3}), w.group());
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
  });
}

}  // namespace
