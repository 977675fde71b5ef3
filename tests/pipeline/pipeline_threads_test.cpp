// Pipelines with ranks as threads (tests/support/thread_world.h), against the same
// modules run in one thread on the whole batch: the micro-batch weights of a loss
// without targets, zero-bubble's split backward with stages that return several
// tensors, recomputation and BatchNorm's statistics, and the labels on a stage's
// failure. Models and data are made before the threads start (the seed is global).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cohort/errors.h"
#include "cohort/pipeline/checkpoint.h"
#include "cohort/pipeline/pipeline.h"
#include "cohort/pipeline/split.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace {

using namespace cohort::pipeline;
using cohort::testing::run_thread_world;

torch::nn::Sequential mlp() {
  torch::manual_seed(7);
  torch::nn::Sequential m;
  m->push_back("fc0", torch::nn::Linear(4, 5));
  m->push_back("act0", torch::nn::Tanh());
  m->push_back("fc1", torch::nn::Linear(5, 5));
  m->push_back("act1", torch::nn::Tanh());
  m->push_back("fc2", torch::nn::Linear(5, 3));
  m->to(torch::kDouble);
  return m;
}

// max |a - b| over the parameters' gradients; a gradient missing on one side only
// counts as the other's largest magnitude.
double max_grad_diff(const torch::nn::Module& mine, const torch::nn::Module& reference) {
  auto ref = reference.named_parameters();
  double worst = 0;
  for (const auto& item : mine.named_parameters()) {
    const auto a = item.value().grad(), b = ref[item.key()].grad();
    double d = 0;
    if (a.defined() != b.defined()) d = (a.defined() ? a : b).abs().max().item<double>() + 1;
    else if (a.defined()) d = (a - b).abs().max().item<double>();
    worst = std::max(worst, d);
  }
  return worst;
}

// Issue 29 item 7: a loss without targets (a mean over the rows of the micro-batch)
// weighs each micro-batch by its rows, so 7 rows cut 4 + 3 (or 3 + 2 + 2) give the
// whole batch's gradient and loss.
class TargetlessLoss : public ::testing::TestWithParam<std::pair<ScheduleKind, int>> {};

TEST_P(TargetlessLoss, WeighsUnevenMicroBatchesByTheirRows) {
  const ScheduleKind kind = GetParam().first;
  const int m = GetParam().second;
  auto model = mlp();
  auto reference = mlp();
  auto x = torch::randn({7, 4}, torch::kDouble);
  auto expected = reference->forward(x).pow(2).mean();
  expected.backward();
  auto parts = split_by_balance(model, {2, 3});
  std::vector<double> losses(2), diffs(2);
  run_thread_world(2, [&](cohort::comm::World& world) {
    const int r = world.rank();
    Pipeline pipe({PipelineStage(parts[r], r)}, world.group(),
                  PipelineOptions([](const TensorList& out, const TensorList&) { return out.at(0).pow(2).mean(); })
                      .schedule(kind)
                      .microbatches(m));
    losses[r] = pipe.step(r == 0 ? TensorList{x} : TensorList{}, {}).loss;
  });
  EXPECT_LT(max_grad_diff(*model, *reference), 1e-12);
  for (double loss : losses) EXPECT_NEAR(loss, expected.item<double>(), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Schedules, TargetlessLoss,
                         ::testing::Values(std::make_pair(ScheduleKind::kGPipe, 2),
                                           std::make_pair(ScheduleKind::k1F1B, 3),
                                           std::make_pair(ScheduleKind::kZeroBubble, 2)));

// Issue 29 item 2: a first stage that returns two tensors, the differentiable one
// second ({mask, h}) or one of them unused by the next stage ({ya, yb}): zero-bubble's
// W pass pairs each output with its own gradient, as 1F1B's single backward does.
struct Encoder : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  Encoder() {
    a = register_module("a", torch::nn::Linear(4, 5));
    b = register_module("b", torch::nn::Linear(4, 5));
  }
  TensorList forward(const std::string& variant, const TensorList& in) {
    auto x = in.at(0);
    if (variant == "mask_first") return {(x.sum(1) > 0).to(torch::kLong), torch::tanh(b(x))};
    return {torch::tanh(a(x)), torch::tanh(b(x))};  // unused_first: the next stage reads only the second
  }
};
struct Head : torch::nn::Module {
  torch::nn::Linear c{nullptr};
  Head() { c = register_module("c", torch::nn::Linear(5, 3)); }
  at::Tensor forward(const std::string& variant, const TensorList& in) {
    if (variant == "mask_first") return c(in.at(1) * (1 + in.at(0).unsqueeze(1).to(torch::kDouble)));
    return c(in.at(1));
  }
};

class MultiOutputStage : public ::testing::TestWithParam<std::string> {};

TEST_P(MultiOutputStage, ZeroBubbleGivesEachOutputItsOwnGradient) {
  const std::string variant = GetParam();
  auto make = [] {
    torch::manual_seed(1);
    auto enc = std::make_shared<Encoder>();
    auto head = std::make_shared<Head>();
    enc->to(torch::kDouble);
    head->to(torch::kDouble);
    return std::make_pair(enc, head);
  };
  const auto modules = make(), reference = make();
  const auto enc = modules.first, enc_ref = reference.first;
  const auto head = modules.second, head_ref = reference.second;
  auto x = torch::randn({6, 4}, torch::kDouble);
  auto y = torch::randint(0, 3, {6});
  torch::nn::functional::cross_entropy(head_ref->forward(variant, enc_ref->forward(variant, {x})), y).backward();
  run_thread_world(2, [&](cohort::comm::World& world) {
    const int r = world.rank();
    std::vector<PipelineStage> mine;
    if (r == 0)
      mine.emplace_back(enc, 0, [enc, variant](const TensorList& in) { return enc->forward(variant, in); }, "enc");
    else
      mine.emplace_back(head, 1, [head, variant](const TensorList& in) {
        return TensorList{head->forward(variant, in)};
      }, "head");
    Pipeline pipe(std::move(mine), world.group(),
                  PipelineOptions([](const TensorList& out, const TensorList& t) {
                    return torch::nn::functional::cross_entropy(out.at(0), t.at(0));
                  }).schedule(ScheduleKind::kZeroBubble).microbatches(2));
    pipe.step(r == 0 ? TensorList{x} : TensorList{}, r == 1 ? TensorList{y} : TensorList{});
  });
  EXPECT_LT(max_grad_diff(*enc, *enc_ref), 1e-12);
  EXPECT_LT(max_grad_diff(*head, *head_ref), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Variants, MultiOutputStage, ::testing::Values("mask_first", "unused_first"));

// Issue 29 item 6: recomputation runs the stage's forward a second time; BatchNorm's
// running statistics must still see each micro-batch once, bit for bit as the model
// run micro-batch by micro-batch in one thread.
TEST(PipelineRecompute, BatchNormStatisticsAreUpdatedOncePerMicroBatch) {
  auto make = [] {
    torch::manual_seed(3);
    torch::nn::Sequential m;
    m->push_back("fc0", torch::nn::Linear(4, 6));
    m->push_back("bn0", torch::nn::BatchNorm1d(6));
    m->push_back("act0", torch::nn::Tanh());
    m->push_back("fc1", torch::nn::Linear(6, 3));
    m->to(torch::kDouble);
    return m;
  };
  auto model = make();
  auto reference = make();
  constexpr int kSteps = 3, kMicro = 2;
  std::vector<at::Tensor> xs;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(torch::randn({8, 4}, torch::kDouble));
    for (const auto& piece : xs.back().tensor_split(kMicro, 0)) reference->forward(piece);
  }
  auto parts = split_by_balance(model, {3, 1});
  run_thread_world(2, [&](cohort::comm::World& world) {
    const int r = world.rank();
    Pipeline pipe({PipelineStage(parts[r], r)}, world.group(),
                  PipelineOptions([](const TensorList& out, const TensorList&) { return out.at(0).pow(2).mean(); })
                      .schedule(ScheduleKind::k1F1B)
                      .microbatches(kMicro)
                      .recompute(true));
    for (const auto& x : xs) pipe.step(r == 0 ? TensorList{x} : TensorList{}, {});
  });
  auto ref = reference->named_buffers();
  for (const auto& item : model->named_buffers())
    EXPECT_TRUE(torch::equal(item.value(), ref[item.key()]))
        << item.key() << ": " << item.value() << " expected " << ref[item.key()];
  EXPECT_EQ(model->named_buffers()["bn0.num_batches_tracked"].item<std::int64_t>(), kSteps * kMicro);
}

// Issue 29 item 13 (D7): a stage or a loss that throws something other than a
// LibTorch error still names the rank, the stage and the action.
std::string failure_of(const StageForward& forward, const LossFn& loss) {
  auto model = mlp();
  std::string message;
  run_thread_world(1, [&](cohort::comm::World& world) {
    Pipeline pipe({PipelineStage(model.ptr(), 0, forward, "model")}, world.group(),
                  PipelineOptions(loss).schedule(ScheduleKind::kGPipe).microbatches(2));
    try {
      pipe.step({torch::randn({4, 4}, torch::kDouble)}, {});
    } catch (const cohort::Error& e) {
      message = e.what();
    }
  });
  return message;
}

TEST(PipelineErrors, ANonLibTorchExceptionIsNamedWithRankStageAndAction) {
  auto model = mlp();
  auto mean = [](const TensorList& out, const TensorList&) { return out.at(0).mean(); };
  auto stage_throws = failure_of([](const TensorList&) -> TensorList { throw std::runtime_error("user failure"); },
                                 mean);
  EXPECT_NE(stage_throws.find("pipeline rank 0 (global rank 0), stage 0, at F0@s0"), std::string::npos)
      << stage_throws;
  EXPECT_NE(stage_throws.find("user failure"), std::string::npos) << stage_throws;
  auto loss_throws = failure_of([net = model.ptr()](const TensorList& in) { return TensorList{net->forward(in.at(0))}; },
                                [](const TensorList&, const TensorList&) -> at::Tensor { throw 42; });
  EXPECT_NE(loss_throws.find("stage 0, at F0@s0 (forward and loss of micro-batch 0)"), std::string::npos)
      << loss_throws;
  EXPECT_NE(loss_throws.find("not a std::exception"), std::string::npos) << loss_throws;
}

// Issue 29 item 13 (D5): evaluation without the pipeline's autocast gives the float32
// model's outputs, bit for bit; with it, bf16 ones. The float32 model runs on the same
// micro-batches (tensor_split into 2) as the pipeline: a GEMM's float32 result may
// differ in the last bit between 3 and 6 rows (MKL, in pip's LibTorch, picks its
// kernel by size).
TEST(PipelineForward, WithoutMixedPrecisionEvaluatesInFloat32) {
  auto model = mlp();
  model->to(torch::kFloat);
  auto x = torch::randn({6, 4});
  at::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> outs;
    for (const auto& micro : x.tensor_split(2, 0)) outs.push_back(model->forward(micro));
    expected = torch::cat(outs, 0);
  }
  TensorList plain, mixed;
  run_thread_world(1, [&](cohort::comm::World& world) {
    Pipeline pipe({PipelineStage(model, 0)}, world.group(),
                  PipelineOptions([](const TensorList& out, const TensorList&) { return out.at(0).mean(); })
                      .autocast(cohort::amp::AutocastOptions(torch::kCPU).dtype(torch::kBFloat16)));
    plain = pipe.forward({x}, 2, /*mixed_precision=*/false);
    mixed = pipe.forward({x}, 2);
  });
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(plain[0], expected));
  EXPECT_EQ(mixed.at(0).scalar_type(), torch::kBFloat16);
}

// Issue 29 item 13 (D4): a pipeline resuming from whole-model checkpoints (DIR/step-N),
// and a run without a pipeline on stage checkpoints, refuse, naming both layouts,
// instead of starting from scratch; nothing on disk changes.
TEST(PipelineCheckpoints, WholeModelAndStageCheckpointsRefuseEachOther) {
  namespace fs = std::filesystem;
  cohort::testing::TempDir dir("cohort-pipeline");
  const std::string plain = dir.path + "/plain", staged = dir.path + "/staged";
  fs::create_directories(plain + "/step-000000010");
  auto model = mlp();
  std::string refusal;
  run_thread_world(1, [&](cohort::comm::World& world) {
    Pipeline pipe({PipelineStage(model, 0)}, world.group(),
                  PipelineOptions([](const TensorList& out, const TensorList&) { return out.at(0).mean(); }));
    cohort::checkpoint::Checkpointer checkpointer(stage_directory(plain, pipe), world.group());
    torch::optim::SGD optimizer(pipe.parameters(), 0.1);
    try {
      load_agreed(plain, pipe, checkpointer, optimizer, world.group(), torch::kCPU);
    } catch (const cohort::ConfigError& e) {
      refusal = e.what();
    }
  });
  EXPECT_NE(refusal.find("checkpoints in " + plain + " (step-N directories) were written by a run without a "
                         "pipeline"),
            std::string::npos)
      << refusal;
  EXPECT_NE(refusal.find("this run is a pipeline of 1 stages (1 pipeline ranks x 1 virtual stages)"),
            std::string::npos)
      << refusal;
  EXPECT_TRUE(fs::is_directory(plain + "/step-000000010"));
  EXPECT_FALSE(fs::exists(layout_path(plain)));
  EXPECT_NO_THROW(refuse_pipeline_checkpoints(plain));

  EXPECT_NO_THROW(refuse_pipeline_checkpoints(staged));  // nothing there yet
  fs::create_directories(staged + "/stage-1/step-000000004");
  std::ofstream(layout_path(staged)) << R"({"pipeline_ranks": 2, "virtual_stages": 1})";
  try {
    refuse_pipeline_checkpoints(staged);
    ADD_FAILURE() << "no refusal";
  } catch (const cohort::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("checkpoints in " + staged + " (stage-<s> directories) were written by a pipeline of 2 "
                        "stages (2 pipeline ranks x 1 virtual stages)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("--pipeline-stages 2 --virtual-stages 1"), std::string::npos) << what;
  }
}

}  // namespace
