// clip_grad_norm_ (optim/clip_grad_norm.h) with ranks as threads, against
// torch::nn::utils::clip_grad_norm_ over the same model whole in one process: the
// same total norm and the same clipped gradients when the model is sliced over a TP
// group (its replicated parameters counted once), spread over pipeline stages (with
// data-parallel replicas that must not be summed), or sharded by fully_shard. And the
// errors for what it cannot do.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <mutex>
#include <string>

#include "cohort/comm/device_mesh.h"
#include "cohort/errors.h"
#include "cohort/optim/clip_grad_norm.h"
#include "cohort/optim/tensor_parallel_parts.h"
#include "cohort/tensor_parallel/block.h"
#include "cohort/zero/fully_shard.h"
#include "support/thread_world.h"
#include "tensor_parallel/twins.h"

namespace {

using cohort::comm::DeviceMesh;
using cohort::comm::MeshDim;
using cohort::comm::MeshShape;
using cohort::comm::World;
using cohort::optim::ClipGradNormOptions;
using cohort::optim::clip_grad_norm_;
using cohort::optim::GradPart;
namespace tp = cohort::tensor_parallel;

constexpr double kInf = std::numeric_limits<double>::infinity();

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::vector<torch::Tensor> twin_parameters(cohort::testing::TwinBlock& t) {
  std::vector<torch::Tensor> out;
  for (auto* m : std::initializer_list<torch::nn::Module*>{t.ln1.get(), t.attention.q.get(), t.attention.k.get(),
                                                            t.attention.v.get(), t.attention.proj.get(), t.ln2.get(),
                                                            t.fc1.get(), t.fc2.get()})
    for (auto& p : m->parameters()) out.push_back(p);
  return out;
}

// Two pre-LN blocks, one-process, with LayerNorms that are not ones and zeros.
struct Twins {
  cohort::testing::TwinBlock first{8, 4}, second{8, 4};
  torch::Tensor x;
  Twins() {
    torch::NoGradGuard no_grad;
    for (auto* t : {&first, &second})
      for (auto* ln : {&t->ln1, &t->ln2}) {
        (*ln)->weight.uniform_(0.5, 1.5);
        (*ln)->bias.uniform_(-0.5, 0.5);
      }
  }
};

// The clipped gradients of `block` are its twin's clipped ones, sliced as the block is.
void expect_clipped_like(tp::ParallelTransformerBlock& block, cohort::testing::TwinBlock& twin,
                         const std::string& what) {
  EXPECT_LT(max_diff(block->ln1->weight.grad(), twin.ln1->weight.grad()), 1e-12) << what;
  EXPECT_LT(max_diff(block->ln2->bias.grad(), twin.ln2->bias.grad()), 1e-12) << what;
  EXPECT_LT(max_diff(block->fc2->bias.grad(), twin.fc2->bias.grad()), 1e-12) << what;
  const auto c0 = block->fc1->first_output(), c1 = block->fc1->last_output();
  EXPECT_LT(max_diff(block->fc1->weight.grad(), twin.fc1->weight.grad().slice(0, c0, c1)), 1e-12) << what;
  EXPECT_LT(max_diff(block->fc1->bias.grad(), twin.fc1->bias.grad().slice(0, c0, c1)), 1e-12) << what;
  EXPECT_LT(max_diff(block->fc2->weight.grad(), twin.fc2->weight.grad().slice(1, c0, c1)), 1e-12) << what;
}

// data x pipeline x tensor ranks, each stage holding one of two TP blocks: every rank
// builds both blocks over its TP group and runs both (the collectives are its TP
// group's), then counts only its own stage's block, as a pipeline stage would. The
// data-parallel replicas compute the same gradients and must not be summed.
void tp_against_twins(int tensor, int pipeline, int data, double max_norm, double norm_type) {
  const std::string what = "tp " + std::to_string(tensor) + " pp " + std::to_string(pipeline) + " dp " +
                           std::to_string(data) + " max_norm " + std::to_string(max_norm) + " norm " +
                           std::to_string(norm_type);
  torch::manual_seed(7);
  Twins twins;
  auto x = torch::randn({2, 6, 8}, torch::kDouble);
  twins.second.forward(twins.first.forward(x)).pow(2).sum().backward();
  auto all = twin_parameters(twins.first);
  if (pipeline > 1)  // else the second block is not counted (a model of one block, and a loss after it)
    for (auto& p : twin_parameters(twins.second)) all.push_back(p);
  const double ref_norm = torch::nn::utils::clip_grad_norm_(all, max_norm, norm_type);
  ASSERT_GT(ref_norm, 0);
  if (max_norm < 1) {
    ASSERT_GT(ref_norm, 2 * max_norm) << "nothing would be clipped: the test proves less";
  }

  cohort::testing::run_thread_world(tensor * pipeline * data, [&](World& w) {
    DeviceMesh mesh(w, MeshShape().tensor(tensor).pipeline(pipeline).data(data));
    auto& tp_group = mesh.group(MeshDim::kTensor);
    tp::ParallelTransformerBlock first(tp_group, tp::ParallelTransformerBlockOptions(8, 4));
    tp::ParallelTransformerBlock second(tp_group, tp::ParallelTransformerBlockOptions(8, 4));
    first->to(torch::kDouble);
    second->to(torch::kDouble);
    cohort::testing::load_twin(first, twins.first);
    cohort::testing::load_twin(second, twins.second);
    second(first(x)).pow(2).sum().backward();
    const int stage = mesh.coordinate(MeshDim::kPipeline);
    auto& mine = (pipeline == 1 || stage == 0) ? first : second;
    std::vector<cohort::comm::Group> also;
    if (pipeline > 1) also.push_back(mesh.group(MeshDim::kPipeline));
    auto parts = cohort::optim::tensor_parallel_parts(*mine, tp_group, also);
    ASSERT_EQ(parts[1].parameters.size(), 6u) << "the LayerNorms and the row-parallel biases";
    auto norm = clip_grad_norm_(parts, ClipGradNormOptions(max_norm).norm_type(norm_type));
    EXPECT_EQ(norm.dim(), 0);
    EXPECT_EQ(norm.scalar_type(), torch::kDouble);
    EXPECT_NEAR(norm.item<double>(), ref_norm, 1e-10 * ref_norm) << what << ", rank " << w.rank();
    auto& twin = (pipeline == 1 || stage == 0) ? twins.first : twins.second;
    expect_clipped_like(mine, twin, what);
  });
}

TEST(ClipGradNormTensorParallel, CountsSlicesOverTheGroupAndReplicatedParametersOnce) {
  for (const int tensor : {2, 4}) {
    tp_against_twins(tensor, 1, 1, 1e-3, 2.0);  // clips
    tp_against_twins(tensor, 1, 1, 1e6, 2.0);   // leaves them
  }
}

TEST(ClipGradNormTensorParallel, InfinityNorm) {
  tp_against_twins(2, 1, 1, 1e-3, kInf);
  tp_against_twins(2, 1, 1, 1e6, kInf);
}

TEST(ClipGradNormTensorParallel, WithinPipelineStagesAndDataReplicas) {
  tp_against_twins(2, 2, 1, 1e-3, 2.0);
  tp_against_twins(2, 2, 1, 1e6, 2.0);
  tp_against_twins(2, 2, 1, 1e-3, kInf);
  tp_against_twins(1, 2, 2, 1e-3, 2.0);  // replicas: not summed
  tp_against_twins(2, 1, 2, 1e-3, 2.0);
}

TEST(ClipGradNormTensorParallel, ThePlainTorchClipOverSlicesIsWrong) {
  // What the library fixes: each rank's own clip_grad_norm_ sees its slices only, and
  // one rank's norm differs from the whole model's.
  torch::manual_seed(7);
  Twins twins;
  auto x = torch::randn({2, 6, 8}, torch::kDouble);
  twins.first.forward(x).pow(2).sum().backward();
  auto all = twin_parameters(twins.first);
  const double ref_norm = torch::nn::utils::clip_grad_norm_(all, 1e6);
  cohort::testing::run_thread_world(2, [&](World& w) {
    tp::ParallelTransformerBlock block(w.group(), tp::ParallelTransformerBlockOptions(8, 4));
    block->to(torch::kDouble);
    cohort::testing::load_twin(block, twins.first);
    block(x).pow(2).sum().backward();
    const double local = torch::nn::utils::clip_grad_norm_(block->parameters(), 1e6);
    EXPECT_GT(std::abs(local - ref_norm), 1e-3 * ref_norm) << "the test proves nothing";
    // Summing the replicated ones over the group as well counts them twice.
    auto wrong = cohort::optim::total_grad_norm({GradPart(block->parameters(), {w.group()})}).item<double>();
    EXPECT_GT(wrong - ref_norm, 1e-6 * ref_norm);
  });
}

// Pipeline stages that are not TP: rank r holds layer r of a two-layer MLP.
TEST(ClipGradNormPipeline, SumsOverStagesHoldingDifferentParameters) {
  for (const double max_norm : {0.05, 1e6}) {
    for (const double norm_type : {2.0, kInf}) {
      torch::manual_seed(5);
      torch::nn::Sequential ref(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 3));
      auto x = torch::randn({5, 4});
      torch::nn::Sequential copy(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 3));
      {
        torch::NoGradGuard no_grad;
        auto from = ref->parameters(), to = copy->parameters();
        for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
      }
      ref->forward(x).pow(2).sum().backward();
      const double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm, norm_type);
      if (max_norm < 1) {
        ASSERT_GT(ref_norm, 2 * max_norm) << "nothing would be clipped";
      }
      std::mutex one_at_a_time;  // the threads share nothing but `copy`'s values, read under the lock
      cohort::testing::run_thread_world(2, [&](World& w) {
        torch::nn::Sequential model(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 3));
        {
          std::lock_guard<std::mutex> lock(one_at_a_time);
          torch::NoGradGuard no_grad;
          auto from = copy->parameters(), to = model->parameters();
          for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
        }
        model->forward(x).pow(2).sum().backward();
        auto stage = model[w.rank() == 0 ? 0 : 2]->parameters();
        auto norm = clip_grad_norm_({GradPart(stage, {w.group()})}, ClipGradNormOptions(max_norm).norm_type(norm_type));
        EXPECT_NEAR(norm.item<double>(), ref_norm, 1e-5 * ref_norm) << "max_norm " << max_norm;
        auto ref_stage = ref[w.rank() == 0 ? 0 : 2]->parameters();
        for (std::size_t i = 0; i < stage.size(); ++i)
          EXPECT_TRUE(torch::allclose(stage[i].grad(), ref_stage[i].grad(), 1e-5, 1e-7))
              << "rank " << w.rank() << " parameter " << i << " max_norm " << max_norm;
      });
    }
  }
}

// fully_shard: each rank holds a disjoint chunk of every flat gradient.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool units) {
    torch::nn::Linear a(5, 7), b(7, 3);
    if (units) {
      ua = register_module("a", cohort::zero::FullyShard<torch::nn::LinearImpl>(a));
      ub = register_module("b", cohort::zero::FullyShard<torch::nn::LinearImpl>(b));
    } else {
      pa = register_module("a", a);
      pb = register_module("b", b);
    }
    scale = register_parameter("scale", torch::full({3}, 1.5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(ua ? ua(x) : pa(x));
    return (ub ? ub(h) : pb(h)) * scale;
  }
  cohort::zero::FullyShard<torch::nn::LinearImpl> ua{nullptr}, ub{nullptr};
  torch::nn::Linear pa{nullptr}, pb{nullptr};
  torch::Tensor scale;
};

TEST(ClipGradNormFullyShard, SumsOverTheShardsAsTheUnshardedModel) {
  static std::mutex seeding;
  for (const double max_norm : {0.05, 1e6}) {
    for (const double norm_type : {2.0, kInf}) {
      torch::manual_seed(9);
      const auto x = torch::randn({4, 5});
      cohort::testing::run_thread_world(2, [&](World& w) {
        cohort::zero::FullyShard<NetImpl> net{nullptr};
        std::shared_ptr<NetImpl> ref;
        {
          std::lock_guard<std::mutex> lock(seeding);
          torch::manual_seed(3);
          net = cohort::zero::FullyShard<NetImpl>(std::make_shared<NetImpl>(true));
          torch::manual_seed(3);
          ref = std::make_shared<NetImpl>(false);
        }
        auto sharded = cohort::zero::fully_shard(net, w.group());
        // Every rank the whole batch: the averaged gradient is the reference's.
        net(x).pow(2).sum().backward();
        ref->forward(x).pow(2).sum().backward();
        const double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm, norm_type);
        if (max_norm < 1) {
          ASSERT_GT(ref_norm, 2 * max_norm) << "nothing would be clipped";
        }
        auto norm = clip_grad_norm_({GradPart(sharded.parameters(), {w.group()})},
                                    ClipGradNormOptions(max_norm).norm_type(norm_type));
        EXPECT_NEAR(norm.item<double>(), ref_norm, 1e-5 * ref_norm) << "max_norm " << max_norm;
        // The clipped gradients, seen through a step of 1: the whole model's values.
        {
          torch::NoGradGuard no_grad;
          for (auto& p : sharded.parameters()) p.sub_(p.grad());
          for (auto& p : ref->parameters()) p.sub_(p.grad());
        }
        auto full = sharded.full_parameters();
        auto mine = net->named_parameters(), theirs = ref->named_parameters();
        ASSERT_EQ(mine.size(), theirs.size());
        for (const auto& item : theirs)
          EXPECT_TRUE(torch::allclose(mine[item.key()], item.value(), 1e-5, 1e-6))
              << item.key() << " max_norm " << max_norm << " norm " << norm_type;
      });
    }
  }
}

TEST(ClipGradNorm, OneProcessEqualsTorch) {
  torch::manual_seed(1);
  torch::nn::Linear a(3, 4), b(3, 4);
  {
    torch::NoGradGuard no_grad;
    b->weight.copy_(a->weight);
    b->bias.copy_(a->bias);
  }
  const auto x = torch::randn({2, 3});
  a(x).sum().backward();
  b(x).sum().backward();
  const double ref = torch::nn::utils::clip_grad_norm_(a->parameters(), 0.1);
  auto norm = clip_grad_norm_({GradPart(b->parameters())}, 0.1);
  EXPECT_NEAR(norm.item<double>(), ref, 1e-6 * ref);
  EXPECT_TRUE(torch::allclose(a->weight.grad(), b->weight.grad()));
  EXPECT_TRUE(torch::allclose(a->bias.grad(), b->bias.grad()));
  // No gradients at all: norm 0, nothing scaled.
  torch::nn::Linear c(3, 4);
  EXPECT_EQ(clip_grad_norm_({GradPart(c->parameters())}, 0.1).item<double>(), 0.0);
}

// A part that is not counted (a tied copy) is scaled with the rest, by the same
// coefficient, and adds nothing to the norm.
TEST(ClipGradNorm, AnUncountedPartIsScaledButNotCounted) {
  torch::manual_seed(2);
  torch::nn::Linear a(3, 4), b(3, 4);
  auto copy = a->weight.detach().clone().requires_grad_(true);
  const auto x = torch::randn({2, 3});
  a(x).sum().backward();
  b(x).sum().backward();
  copy.mutable_grad() = a->weight.grad().clone();
  auto whole = a->parameters();
  for (const auto& p : b->parameters()) whole.push_back(p);
  std::vector<at::Tensor> reference;
  for (const auto& p : whole) reference.push_back(p.detach().clone().requires_grad_(true));
  for (std::size_t i = 0; i < whole.size(); ++i) reference[i].mutable_grad() = whole[i].grad().clone();
  const double ref = torch::nn::utils::clip_grad_norm_(reference, 0.1);
  ASSERT_LT(0.1, ref);  // clipping happens
  auto norm = clip_grad_norm_({GradPart(a->parameters()), GradPart(b->parameters()),
                               GradPart({copy}, {}, /*counted=*/false)},
                              0.1);
  EXPECT_NEAR(norm.item<double>(), ref, 1e-6 * ref);
  for (std::size_t i = 0; i < whole.size(); ++i) EXPECT_TRUE(torch::allclose(whole[i].grad(), reference[i].grad()));
  EXPECT_TRUE(torch::equal(copy.grad(), a->weight.grad()));
}

void expect_config_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying '" << needle << "'";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ClipGradNorm, RefusesBadInputSayingWhy) {
  torch::nn::Linear lin(2, 2);
  lin(torch::ones({1, 2})).sum().backward();
  const std::vector<GradPart> parts{GradPart(lin->parameters())};
  expect_config_error([&] { clip_grad_norm_(parts, 0.0); }, "max_norm is 0");
  expect_config_error([&] { clip_grad_norm_(parts, -1.0); }, "give a positive bound");
  expect_config_error([&] { clip_grad_norm_(parts, std::nan("")); }, "max_norm is nan");
  expect_config_error([&] { clip_grad_norm_(parts, ClipGradNormOptions(1.0).norm_type(1.0)); },
                      "norm_type 1 is not supported; use 2 or");
  expect_config_error([&] { cohort::optim::total_grad_norm(parts, -kInf); }, "norm_type -inf");
  // Gradients on two devices.
  auto elsewhere = torch::zeros({2}, torch::TensorOptions().device(torch::kMeta)).requires_grad_();
  elsewhere.mutable_grad() = torch::ones({2}, torch::TensorOptions().device(torch::kMeta));
  expect_config_error([&] { clip_grad_norm_({GradPart(lin->parameters()), GradPart({elsewhere})}, 1.0); },
                      "the gradient of parameter 0 of part 1 is on meta, that of parameter 0 of part 0 on cpu");
  // One parameter in two parts would count twice.
  expect_config_error([&] { clip_grad_norm_({GradPart(lin->parameters()), GradPart({lin->weight})}, 1.0); },
                      "parameter 0 of part 1 is in part 0 too");
  expect_config_error([&] { clip_grad_norm_({GradPart({torch::Tensor()})}, 1.0); },
                      "parameter 0 of part 0 is an undefined tensor");
  // A group this rank is not in.
  expect_config_error([&] { clip_grad_norm_({GradPart(lin->parameters(), {cohort::comm::Group()})}, 1.0); },
                      "part 0 names a group this rank is not a member of");
  // Nothing was scaled by the refusals.
  auto before = lin->weight.grad().clone();
  clip_grad_norm_(parts, 1e6);
  EXPECT_TRUE(torch::equal(before, lin->weight.grad()));
}

TEST(ClipGradNorm, ErrorIfNonfiniteLeavesTheGradients) {
  torch::nn::Linear lin(2, 2);
  lin(torch::ones({1, 2})).sum().backward();
  lin->weight.mutable_grad()[0][0] = std::numeric_limits<double>::quiet_NaN();
  auto before = lin->bias.grad().clone();
  try {
    clip_grad_norm_({GradPart(lin->parameters())}, ClipGradNormOptions(1e-3).error_if_nonfinite(true));
    ADD_FAILURE() << "no error for a NaN gradient";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the total 2-norm of the gradients is nan"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(before, lin->bias.grad()));
}

TEST(ClipGradNorm, TensorParallelPartsRefusesALayerOfAnotherGroup) {
  cohort::testing::run_thread_world(2, [&](World& w) {
    DeviceMesh mesh(w, MeshShape().tensor(1));
    auto& self = mesh.group(MeshDim::kTensor);  // this rank alone
    tp::ParallelTransformerBlock block(w.group(), tp::ParallelTransformerBlockOptions(8, 4));
    expect_config_error([&] { cohort::optim::tensor_parallel_parts(*block, self); },
                        "is split over ranks 0,1, not over the TP group given");
  });
}

}  // namespace
