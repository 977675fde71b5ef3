// Checkpoints of a tensor-parallel model (ranks as threads): saved whole at TP 2,
// loaded at TP 1, 2 and 4 into weights and Adam state equal to the one-process
// model's; a resumed run equal to an uninterrupted one; the refusals
// (Note [Checkpoints hold whole tensors]).
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <mutex>
#include <string>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/compat/optimizer.h"
#include "cohort/errors.h"
#include "cohort/tensor_parallel/block.h"
#include "cohort/tensor_parallel/checkpoint.h"
#include "cohort/tensor_parallel/cross_entropy.h"
#include "cohort/tensor_parallel/embedding.h"
#include "cohort/zero/sharded_optimizer.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace {

using cohort::comm::World;
using namespace cohort::tensor_parallel;
namespace ckpt = cohort::checkpoint;
using Tensors = std::map<std::string, torch::Tensor>;

constexpr std::int64_t kVocab = 8, kHidden = 8, kHeads = 4;

// A tiny language model with every kind of split: a vocabulary-parallel embedding
// tied to the output, a block (column- and row-parallel layers, replicated
// LayerNorms and row biases).
struct NetImpl : torch::nn::Module {
  VocabParallelEmbedding embed{nullptr};
  ParallelTransformerBlock block{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  NetImpl(cohort::comm::Group g, std::int64_t vocab = kVocab) {
    embed = register_module("embed", VocabParallelEmbedding(g, VocabParallelEmbeddingOptions(vocab, kHidden)));
    block = register_module("block", ParallelTransformerBlock(g, ParallelTransformerBlockOptions(kHidden, kHeads)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    to(torch::kDouble);
  }
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets, cohort::comm::Group g) {
    return vocab_parallel_cross_entropy(embed->logits(norm(block(embed(ids)))), targets, g);
  }
};
TORCH_MODULE(Net);

// The same weights on every thread: torch::manual_seed is process-wide, so the
// threads draw one at a time (construction has no collective).
Net make_net(cohort::comm::Group g, std::uint64_t seed, std::int64_t vocab = kVocab) {
  static std::mutex draw;
  std::lock_guard<std::mutex> lock(draw);
  torch::manual_seed(seed);
  return Net(std::move(g), vocab);
}

torch::Tensor batch(int step) {
  return torch::randint(kVocab, {2, 5}, at::detail::createCPUGenerator(50 + step));
}

std::unique_ptr<torch::optim::Adam> adam(Net& net) {
  return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
}

void train(Net& net, torch::optim::Optimizer& opt, World& w, int from, int to) {
  for (int step = from; step < to; ++step) {
    const auto ids = batch(step);
    opt.zero_grad();
    net->loss(ids, ids.roll(1, 1), w.group()).backward();
    opt.step();
  }
}

// The model's parameters whole (collective), and its Adam moments whole, by name.
Tensors whole_weights(Net& net) {
  Tensors out;
  for (const auto& item : ckpt::whole_state_dict(*net, parameter_splits(*net))) out[item.key()] = item.value();
  return out;
}
Tensors whole_moments(Net& net, torch::optim::Adam& opt) {
  Tensors out;
  // Each rank's state is of its own slices (a whole one would pass the gather untouched).
  for (const auto& p : net->parameters()) {
    const auto& s = static_cast<torch::optim::AdamParamState&>(*opt.state().at(cohort::compat::optimizer_state_key(p)));
    EXPECT_EQ(s.exp_avg().sizes(), p.sizes());
    EXPECT_EQ(s.exp_avg_sq().sizes(), p.sizes());
  }
  ckpt::WholeOptimizerState whole(opt, *net, parameter_splits(*net));
  for (const auto& item : net->named_parameters()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(
        *opt.state().at(cohort::compat::optimizer_state_key(item.value())));
    out[item.key() + ".exp_avg"] = s.exp_avg().clone();
    out[item.key() + ".exp_avg_sq"] = s.exp_avg_sq().clone();
    out[item.key() + ".step"] = torch::tensor(s.step());
  }
  return out;
}

double max_diff(const Tensors& a, const Tensors& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "no " << name;
      continue;
    }
    EXPECT_EQ(t.sizes(), it->second.sizes()) << name;
    if (t.sizes() == it->second.sizes())
      worst = std::max(worst, (t.to(torch::kDouble) - it->second.to(torch::kDouble)).abs().max().item<double>());
  }
  return worst;
}

ckpt::CheckpointerOptions split_options() {
  return ckpt::CheckpointerOptions().split_parameters(parameter_splits).warn([](const std::string&) {});
}

// A model's weights and Adam state, whole.
struct Snapshot {
  Tensors weights, moments;
};

// The one-process run after `steps` steps.
Snapshot one_process(int steps) {
  Snapshot out;
  cohort::testing::run_thread_world(1, [&](World& w) {
    Net net = make_net(w.group(), 3);
    auto opt = adam(net);
    train(net, *opt, w, 0, steps);
    out = {whole_weights(net), whole_moments(net, *opt)};
  });
  return out;
}

// Trains `steps` at TP 2 from seed 3 and saves into `dir`; what it saved, whole.
Snapshot save_at_tp2(const std::string& dir, int steps, bool split = true) {
  Snapshot saved;
  cohort::testing::run_thread_world(2, [&](World& w) {
    Net net = make_net(w.group(), 3);
    auto opt = adam(net);
    train(net, *opt, w, 0, steps);
    ckpt::Checkpointer c(dir, w.group(), split ? split_options() : ckpt::CheckpointerOptions());
    c.save(*net, *opt, {steps, 0, steps, std::nullopt}, torch::kCPU);
    auto weights = whole_weights(net);
    auto moments = whole_moments(net, *opt);
    if (w.rank() == 0) saved = {weights, moments};
  });
  return saved;
}

TEST(TensorParallelCheckpoint, SavedAtTwoLoadsAtOneTwoAndFourAsTheOneProcessModel) {
  const auto reference = one_process(3);
  cohort::testing::TempDir temp("cohort-tp-ckpt");
  const auto saved = save_at_tp2(temp.path, 3);
  // TP 2 trains as one process does, but for rounding (Adam divides by sqrt(v),
  // which magnifies the last bits of small gradients).
  const double trained = max_diff(saved.weights, reference.weights);
  EXPECT_LT(trained, 1e-9);
  EXPECT_LT(max_diff(saved.moments, reference.moments), 1e-12);

  // model.pt is the one-process state dict: whole tensors under the same names.
  const auto dict = ckpt::torch_load_bytes(
      ckpt::read_whole_file(temp.path + "/step-000000003/model.pt"), "model.pt").toGenericDict();
  Tensors on_disk;
  for (const auto& e : dict) on_disk[e.key().toStringRef()] = e.value().toTensor();
  EXPECT_EQ(on_disk.at("embed.weight").sizes(), (std::vector<std::int64_t>{kVocab, kHidden}));
  EXPECT_EQ(on_disk.at("block.fc1.weight").sizes(), (std::vector<std::int64_t>{4 * kHidden, kHidden}));
  EXPECT_EQ(on_disk.at("block.fc2.weight").sizes(), (std::vector<std::int64_t>{kHidden, 4 * kHidden}));
  EXPECT_EQ(max_diff(on_disk, saved.weights), 0.0);

  for (int tp : {1, 2, 4}) {
    std::mutex mu;
    double weights = 1, moments = 1;
    cohort::testing::run_thread_world(tp, [&](World& w) {
      Net net = make_net(w.group(), 1000 + tp);  // other weights, which the checkpoint replaces
      auto opt = adam(net);
      ckpt::Checkpointer c(temp.path, w.group(), split_options());
      const auto restored = c.load_latest(*net, *opt, torch::kCPU);
      ASSERT_TRUE(restored.has_value());
      EXPECT_EQ(restored->progress.step, 3);
      EXPECT_EQ(net->block->fc1->weight.size(0), 4 * kHidden / tp);
      const auto dw = max_diff(whole_weights(net), saved.weights);
      const auto dm = max_diff(whole_moments(net, *opt), saved.moments);
      std::lock_guard<std::mutex> lock(mu);
      if (w.rank() == 0) weights = dw, moments = dm;
    });
    // Slicing moves numbers, it computes none: exactly what was saved.
    EXPECT_EQ(weights, 0.0) << "loaded at TP " << tp;
    EXPECT_EQ(moments, 0.0) << "loaded at TP " << tp;
    std::cout << "loaded at TP " << tp << ": max |weight - saved| " << weights << ", max |Adam state - saved| "
              << moments << "; saved vs one process: " << trained << std::endl;
  }
}

// Train 3 steps at TP 2, checkpoint, train 2 more; against: resume from the
// checkpoint at TP 2 (and at TP 1) and train the 2.
TEST(TensorParallelCheckpoint, AResumedRunEqualsAnUninterruptedOne) {
  cohort::testing::TempDir temp("cohort-tp-ckpt");
  Tensors uninterrupted;
  cohort::testing::run_thread_world(2, [&](World& w) {
    Net net = make_net(w.group(), 3);
    auto opt = adam(net);
    train(net, *opt, w, 0, 3);
    ckpt::Checkpointer(temp.path, w.group(), split_options()).save(*net, *opt, {3, 0, 3, std::nullopt}, torch::kCPU);
    train(net, *opt, w, 3, 5);
    auto whole = whole_weights(net);
    if (w.rank() == 0) uninterrupted = whole;
  });
  for (int tp : {2, 1}) {
    Tensors resumed;
    cohort::testing::run_thread_world(tp, [&](World& w) {
      Net net = make_net(w.group(), 77);
      auto opt = adam(net);
      ckpt::Checkpointer c(temp.path, w.group(), split_options());
      ASSERT_TRUE(c.load_latest(*net, *opt, torch::kCPU).has_value());
      train(net, *opt, w, 3, 5);
      auto whole = whole_weights(net);
      if (w.rank() == 0) resumed = whole;
    });
    const double d = max_diff(resumed, uninterrupted);
    // At TP 2 the same operations in the same order: bit for bit. At TP 1 the
    // all-reduces' partial sums are one sum: rounding apart (magnified by Adam).
    if (tp == 2) {
      EXPECT_EQ(d, 0.0);
    }
    EXPECT_LT(d, 1e-10) << "resumed at TP " << tp;
    std::cout << "resumed at TP " << tp << ": max |weight - uninterrupted TP 2| " << d << std::endl;
  }
}

TEST(TensorParallelCheckpoint, ATpSizeThatCannotSplitIsRefused) {
  cohort::testing::TempDir temp("cohort-tp-ckpt");
  // A vocabulary of 6 saved at TP 2.
  cohort::testing::run_thread_world(2, [&](World& w) {
    Net net = make_net(w.group(), 3, 6);
    auto opt = adam(net);
    ckpt::Checkpointer(temp.path, w.group(), split_options()).save(*net, *opt, {1, 0, 1, std::nullopt}, torch::kCPU);
  });
  // TP 4 cannot build that model ...
  cohort::testing::run_thread_world(4, [&](World& w) {
    try {
      Net net(w.group(), 6);
      ADD_FAILURE() << "built a vocabulary of 6 over 4 ranks";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("num_embeddings is 6, which the 4 ranks"), std::string::npos) << e.what();
    }
  });
  // ... and one padded to 8 cannot load it: the whole table of 6 rows does not split.
  cohort::testing::run_thread_world(4, [&](World& w) {
    Net net(w.group(), 8);
    auto opt = adam(net);
    const auto before = net->embed->weight.clone();
    ckpt::Checkpointer c(temp.path, w.group(), split_options());
    try {
      c.load_latest(*net, *opt, torch::kCPU);
      ADD_FAILURE() << "loaded 6 rows into 4 ranks";
    } catch (const cohort::ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'embed.weight' is [6, 8] whole, whose dimension 0 (6) the 4 ranks of TP group 'world' "
                       "cannot split evenly; load it at a TP size that divides 6"),
                std::string::npos)
          << m;
    }
    EXPECT_TRUE(net->embed->weight.equal(before)) << "a refused checkpoint must leave the model as it was";
  });
}

TEST(TensorParallelCheckpoint, SlicesSavedWithoutTheOptionAreRefusedNamingIt) {
  cohort::testing::TempDir temp("cohort-tp-ckpt");
  // Without split_parameters, rank 0 writes its own slices: not a checkpoint of the model.
  save_at_tp2(temp.path, 1, /*split=*/false);
  cohort::testing::run_thread_world(2, [&](World& w) {
    Net net(w.group());
    auto opt = adam(net);
    try {
      ckpt::Checkpointer(temp.path, w.group(), split_options()).load_latest(*net, *opt, torch::kCPU);
      ADD_FAILURE() << "loaded slices as whole tensors";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("without CheckpointerOptions::split_parameters"), std::string::npos)
          << e.what();
    }
  });
}

TEST(TensorParallelCheckpoint, AZeroOptimizerIsRefusedOnEveryRank) {
  cohort::testing::TempDir temp("cohort-tp-ckpt");
  cohort::testing::run_thread_world(2, [&](World& w) {
    Net net(w.group());
    cohort::zero::ShardedOptimizer opt(net->parameters(), w.group(), [](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(1e-2));
    });
    try {
      ckpt::Checkpointer(temp.path, w.group(), split_options()).save(*net, opt, {1, 0, 1, std::nullopt}, torch::kCPU);
      ADD_FAILURE() << "saved a ZeRO optimizer of TP slices";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("with a ZeRO optimizer"), std::string::npos) << e.what();
    }
  });
}

TEST(TensorParallelCheckpoint, ACheckpointerGroupWithoutWholeTpGroupsIsRefused) {
  cohort::testing::TempDir temp("cohort-tp-ckpt");
  cohort::testing::run_thread_world(2, [&](World& w) {
    auto first = w.new_group({0});  // collective; rank 1 gets a non-member's handle
    Net net = make_net(w.group(), 3);
    auto opt = adam(net);
    if (w.rank() != 0) return;
    try {
      ckpt::Checkpointer(temp.path, first, split_options()).save(*net, *opt, {1, 0, 1, std::nullopt}, torch::kCPU);
      ADD_FAILURE() << "saved half a TP group";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("whose global rank 1 is not in the checkpointer's group"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
