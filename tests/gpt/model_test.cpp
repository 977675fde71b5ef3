// The GPT example's model and pipeline stage (examples/gpt/model.h, pipeline.h) in
// one rank: what a stage's eval() switches off, and what padding the vocabulary for
// TP draws.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model.h"
#include "pipeline.h"
#include "support/thread_world.h"

namespace {

using cohort::comm::World;

gpt::GptOptions tiny(std::int64_t vocab) {
  return gpt::GptOptions(vocab).context(8).embed_dim(16).num_heads(2).layers(2).dropout(0.5);
}

// Note [The stage's mode is the model's] (pipeline.cpp): the first stage's embedding
// dropout belongs to the Gpt, which is not the stage's child. Before, eval() left it
// on: two evaluations differed, and each drew from the generator.
TEST(GptStage, EvalSwitchesOffTheFirstStagesEmbeddingDropout) {
  cohort::testing::run_thread_world(1, [](World& w) {
    torch::manual_seed(1);
    gpt::Gpt model(w.group(), tiny(32));
    gpt::GptStage stage(model, 0, 2);  // the embeddings and block 0
    auto ids = torch::randint(0, 32, {2, 8}, torch::kLong);
    torch::NoGradGuard no_grad;

    stage->eval();
    torch::manual_seed(7);
    auto a = stage->forward(ids);
    auto b = stage->forward(ids);
    const auto after = torch::rand({4});
    torch::manual_seed(7);
    EXPECT_TRUE(torch::equal(torch::rand({4}), after)) << "evaluation drew from the generator";
    EXPECT_TRUE(torch::equal(a, b));
    EXPECT_FALSE(model->is_training());
    // The same as the Gpt's own embeddings and block 0 in evaluation.
    model->eval();
    auto x = model->embed_tokens(ids);
    x = (*model->blocks)[0]->as<cohort::tensor_parallel::ParallelTransformerBlock>()->forward(x);
    EXPECT_TRUE(torch::equal(a, x));

    stage->train();
    EXPECT_FALSE(torch::equal(stage->forward(ids), stage->forward(ids))) << "train() left dropout off";
    EXPECT_TRUE(model->is_training());
  });
}

// Note [The padding draws nothing] (model.cpp): a vocabulary padded for TP (257 rows
// at TP 1, 258 at TP 2) starts from the unpadded model's weights, its padding rows
// zero, with the generator where the unpadded model leaves it (dropout's draws).
TEST(GptModel, PaddingTheVocabularyChangesNoDraw) {
  cohort::testing::run_thread_world(1, [](World& w) {
    torch::manual_seed(4);
    gpt::Gpt unpadded(w.group(), tiny(37));
    const auto next_unpadded = torch::rand({4});
    torch::manual_seed(4);
    gpt::Gpt padded(w.group(), tiny(40).unpadded_vocab_size(37));
    const auto next_padded = torch::rand({4});
    EXPECT_TRUE(torch::equal(next_padded, next_unpadded));

    const auto a = unpadded->named_parameters(), b = padded->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& p : a) {
      const auto& q = b[p.key()];
      if (p.key() == "embed.weight") {
        ASSERT_EQ(q.size(0), 40);
        EXPECT_TRUE(torch::equal(q.slice(0, 0, 37), p.value())) << p.key();
        EXPECT_TRUE(torch::equal(q.slice(0, 37), torch::zeros({3, 16}))) << "the padding's rows";
      } else {
        EXPECT_TRUE(torch::equal(q, p.value())) << p.key();
      }
    }
    // Unpadded (or a vocabulary the TP size divides), it draws as it always did.
    torch::manual_seed(4);
    gpt::Gpt same(w.group(), tiny(37).unpadded_vocab_size(37));
    EXPECT_TRUE(torch::equal(same->embed->weight, unpadded->embed->weight));
  });
}

}  // namespace
