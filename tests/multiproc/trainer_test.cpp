// The Fashion-MNIST trainer as a user runs it, through `cohort run`: world 2 equals
// world 1 with twice the batch, a run killed with kill -9 and resumed ends with the
// same weights as one never interrupted, and Python's torch.load reads what it saves.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "support/fashion_subset.h"
#include "support/state_dicts.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "cohort/system/cuda.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using cohort::testing::bitwise_equal;
using cohort::testing::max_difference;
using cohort::testing::TempDir;

std::vector<std::string> trainer(int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", std::to_string(nproc), "--stop-timeout",
                                "3", COHORT_TRAINER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

cohort::testing::ProcessResult run_trainer(int nproc, const std::vector<std::string>& args) {
  // One thread per worker at every world size, so that worlds are compared on the
  // data they train on, not on thread counts (Note [One thread per worker] in
  // elastic_test.cpp).
  return cohort::testing::run_process(trainer(nproc, args), 240s, {{"COHORT_TIMEOUT", "60"}, {"OMP_NUM_THREADS", "1"}});
}

std::string describe(const cohort::testing::ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out + "\n--- stderr\n" + r.err;
}

// Note [Rounding across world sizes]: the bound on weights trained at two world
// sizes for tens of steps.
constexpr double kAcrossWorldSizes = 1e-4;

const std::vector<std::string> kQuick = {"--epochs", "1", "--limit-train-batches", "8", "--optimizer", "sgd",
                                         "--lr",     "0.05", "--seed", "11"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace

TEST(Trainer, WorldTwoEqualsWorldOneWithTwiceTheBatch) {
  TempDir dir("cohort-trainer");
  const auto two = dir.path + "/two.pt", one = dir.path + "/one.pt", half = dir.path + "/half.pt";
  auto r2 = run_trainer(2, with(kQuick, {"--batch-size", "16", "--save-final", two}));
  ASSERT_EQ(r2.exit_code, 0) << describe(r2);
  auto r1 = run_trainer(1, with(kQuick, {"--batch-size", "32", "--save-final", one}));
  ASSERT_EQ(r1.exit_code, 0) << describe(r1);
  // World 2 × 16 saw exactly the samples of world 1 × 32, in the same steps.
  EXPECT_LT(max_difference(two, one), 1e-5);
  // The comparison can tell runs apart: world 1 with the smaller batch trains differently.
  auto r3 = run_trainer(1, with(kQuick, {"--batch-size", "16", "--save-final", half}));
  ASSERT_EQ(r3.exit_code, 0) << describe(r3);
  EXPECT_GT(max_difference(two, half), 1e-3);
  // Rank 0 ends with one JSON line.
  EXPECT_NE(r2.out.find("[rank0]: {\"amp\":\"off\",\"comm_hook\":\"allreduce\",\"cuda_graphs\":false,\"device\":\"cpu\""),
            std::string::npos)
      << r2.out;
  EXPECT_NE(r2.out.find("\"world_size\":2"), std::string::npos) << r2.out;
}

// `flags` are added to every run (--checkpoint-async: the kill may land while a
// thread writes a checkpoint).
void killed_and_resumed_equals_uninterrupted(const std::vector<std::string>& flags) {
  TempDir dir("cohort-trainer");
  const std::vector<std::string> args =
      with({"--deterministic", "--epochs", "2", "--limit-train-batches", "15", "--batch-size", "32",
            "--checkpoint-every", "4", "--seed", "5"},
           flags);
  const auto straight = dir.path + "/straight.pt", resumed = dir.path + "/resumed.pt";
  auto r = run_trainer(2, with(args, {"--checkpoint-dir", dir.path + "/a", "--save-final", straight}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);

  // The same run, killed with SIGKILL (launcher and workers) once step 8's checkpoint exists.
  const std::string ckpt = dir.path + "/b";
  {
    cohort::testing::Subprocess run(trainer(2, with(args, {"--checkpoint-dir", ckpt, "--save-final", resumed})),
                                    {{"COHORT_TIMEOUT", "60"}});
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (!fs::exists(ckpt + "/step-000000008") && std::chrono::steady_clock::now() < deadline) {
      run.read_until([](const std::string&) { return false; }, 5ms);
    }
    ASSERT_TRUE(fs::exists(ckpt + "/step-000000008")) << run.out();
    ::kill(-run.pid(), SIGKILL);
    auto killed = run.finish(30s);
    ASSERT_EQ(killed.signal, SIGKILL) << describe(killed);
  }
  ASSERT_FALSE(fs::exists(resumed)) << "the run ended before it was killed";

  auto again = run_trainer(2, with(args, {"--checkpoint-dir", ckpt, "--save-final", resumed}));
  ASSERT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_NE(again.out.find("[rank0]: resuming from " + ckpt + "/step-"), std::string::npos) << again.out;
  EXPECT_TRUE(bitwise_equal(straight, resumed)) << "largest difference " << max_difference(straight, resumed);
}

TEST(Trainer, KilledAndResumedEqualsUninterrupted) { killed_and_resumed_equals_uninterrupted({}); }

// --checkpoint-async (docs/checkpoints.md#asynchronous-checkpoints).
TEST(Trainer, KilledDuringAsyncCheckpointsAndResumedEqualsUninterrupted) {
  killed_and_resumed_equals_uninterrupted({"--checkpoint-async"});
}

// Stopped by --max-steps 7 with `flags` (checkpoints every 3 steps) and resumed
// with them, a run under `strategy` equals its uninterrupted run; returns the first
// run's output.
std::string stopped_and_resumed_equals_uninterrupted(const std::vector<std::string>& strategy,
                                                     const std::vector<std::string>& flags) {
  TempDir dir("cohort-trainer");
  const auto args = with(with(kQuick, strategy), {"--deterministic", "--checkpoint-every", "3"});
  const auto straight = dir.path + "/straight.pt", resumed = dir.path + "/resumed.pt";
  const auto ckpt = dir.path + "/ckpt";
  auto u = run_trainer(2, with(args, {"--save-final", straight}));
  EXPECT_EQ(u.exit_code, 0) << describe(u);
  auto first = run_trainer(2, with(with(args, flags), {"--checkpoint-dir", ckpt, "--max-steps", "7"}));
  EXPECT_EQ(first.exit_code, 0) << describe(first);
  std::size_t in_pytorchs_format = 0;
  if (fs::exists(ckpt))
    for (const auto& e : fs::recursive_directory_iterator(ckpt)) in_pytorchs_format += e.path().filename() == ".metadata";
  const bool dcp = std::find(flags.begin(), flags.end(), "dcp") != flags.end();
  EXPECT_EQ(in_pytorchs_format > 0, dcp) << strategy[0] << ": " << in_pytorchs_format << " .metadata files";
  auto second = run_trainer(2, with(with(args, flags), {"--checkpoint-dir", ckpt, "--save-final", resumed}));
  EXPECT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resuming from "), std::string::npos) << second.out;
  EXPECT_TRUE(bitwise_equal(straight, resumed))
      << strategy[0] << ": largest difference " << max_difference(straight, resumed);
  return first.out;
}

// --checkpoint-async under the strategies whose checkpoints differ: ZeRO-1 (its
// shards gathered to rank 0's writer), ZeRO-3 (the full parameters) and a pipeline
// (a checkpointer per stage). Each equals its uninterrupted run, and the final line
// says what the checkpoints cost.
TEST(Trainer, AsyncCheckpointsResumeUnderEachStrategy) {
  for (const auto& strategy : std::vector<std::vector<std::string>>{
           {"--zero", "1"}, {"--zero", "3"}, {"--pipeline-stages", "2", "--microbatches", "2"}}) {
    const auto first = stopped_and_resumed_equals_uninterrupted(strategy, {"--checkpoint-async"});
    EXPECT_NE(first.find("\"checkpoints\":{\"async\":true"), std::string::npos) << first;
  }
}

// --checkpoint-format dcp (docs/checkpoints.md#pytorchs-distributed-checkpoints):
// each step-N is PyTorch's format, written by a thread and killed mid-write.
TEST(Trainer, KilledDuringAsyncCheckpointsInPyTorchsFormatAndResumedEqualsUninterrupted) {
  killed_and_resumed_equals_uninterrupted({"--checkpoint-format", "dcp", "--checkpoint-async"});
}

// --checkpoint-format dcp where the checkpointer gathers from the ranks: ZeRO-3's
// sharded parameters and state, and a pipeline (a checkpointer per stage).
TEST(Trainer, CheckpointsInPyTorchsFormatResumeUnderZeroAndPipelines) {
  for (const auto& strategy :
       std::vector<std::vector<std::string>>{{"--zero", "3"}, {"--pipeline-stages", "2", "--microbatches", "2"}})
    stopped_and_resumed_equals_uninterrupted(strategy, {"--checkpoint-format", "dcp"});
}

TEST(Trainer, CheckpointAsyncFlagsThatCannotWorkExitTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--checkpoint-async"}, "and there is none; give --checkpoint-dir"},
      {{"--checkpoint-when-busy", "skip", "--checkpoint-dir", "/tmp/unused"}, "applies to --checkpoint-async"},
      {{"--checkpoint-async", "--checkpoint-dir", "/tmp/unused", "--fault-tolerance"},
       "--checkpoint-async with --fault-tolerance"},
      {{"--checkpoint-async", "--checkpoint-dir", "/tmp/unused", "--checkpoint-when-busy", "later"},
       "--checkpoint-when-busy"},
      {{"--checkpoint-format", "dcp"}, "and there is none; give --checkpoint-dir"},
      {{"--checkpoint-format", "dcp", "--checkpoint-dir", "/tmp/unused", "--fault-tolerance"},
       "--checkpoint-format dcp with --fault-tolerance"},
      {{"--checkpoint-format", "safetensors", "--checkpoint-dir", "/tmp/unused"}, "--checkpoint-format"}};
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> argv{COHORT_TRAINER_PATH};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto r = cohort::testing::run_process(argv, 30s);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find(message), std::string::npos) << describe(r);
  }
}


// Stopped by one process mid-epoch and resumed by two: the rest of the epoch is
// re-sharded, nothing is lost or trained twice, and the weights equal the run that
// one process did without stopping (world 2 × 16 trains the batches of world 1 × 32).
TEST(Trainer, ResumedOnAnotherWorldSizeEqualsUninterrupted) {
  TempDir dir("cohort-trainer");
  const auto data = cohort::testing::fashion_subset(dir.path, 2000);
  const std::vector<std::string> args = {"--data-dir", data, "--epochs", "1", "--optimizer", "sgd",
                                         "--lr", "0.05", "--seed", "9"};
  const auto straight = dir.path + "/straight.pt", resumed = dir.path + "/resumed.pt";
  const auto ckpt = dir.path + "/ckpt";
  auto u = run_trainer(1, with(args, {"--batch-size", "32", "--save-final", straight}));
  ASSERT_EQ(u.exit_code, 0) << describe(u);
  EXPECT_NE(u.out.find("\"samples\":2000"), std::string::npos) << u.out;

  auto first = run_trainer(1, with(args, {"--batch-size", "32", "--checkpoint-dir", ckpt, "--max-steps", "20"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  EXPECT_NE(first.out.find("\"samples\":640"), std::string::npos) << first.out;
  auto second = run_trainer(2, with(args, {"--batch-size", "16", "--checkpoint-dir", ckpt, "--save-final", resumed}));
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resuming from " + ckpt + "/step-000000020"), std::string::npos) << second.out;
  // Exactly the 1360 samples the first run had not trained.
  EXPECT_NE(second.out.find("\"samples\":1360"), std::string::npos) << second.out;
  // Note [Rounding across world sizes]: 63 steps at world 1 x 32 and world 2 x 16
  // sum each gradient in another order; the rounding grows with the steps to about
  // 1e-5 here (1.15e-5 seen), depending on the BLAS kernels of the machine. A batch
  // trained twice or skipped, or a wrong learning rate, moves the weights by 1e-3
  // and more.
  EXPECT_LT(max_difference(straight, resumed), kAcrossWorldSizes);
}

TEST(Trainer, PythonLoadsTheSavedStateDict) {
  TempDir dir("cohort-trainer");
  const auto saved = dir.path + "/final.pt", resaved = dir.path + "/resaved.pt";
  auto r = run_trainer(1, with(kQuick, {"--batch-size", "64", "--save-final", saved}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto py = cohort::testing::run_process(
      {COHORT_PYTHON_PATH, COHORT_CHECK_STATE_DICT_PATH, saved, "/usr/share/datasets/fashion-mnist", resaved}, 120s);
  ASSERT_EQ(py.exit_code, 0) << describe(py);
  EXPECT_NE(py.out.find(R"("keys": ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", )"
                        R"("fc1.bias", "fc2.weight", "fc2.bias"])"),
            std::string::npos)
      << py.out;
  // What Python saved back is bitwise what C++ wrote.
  EXPECT_TRUE(bitwise_equal(saved, resaved));
}

TEST(Trainer, BadFlagsExitTwoNamingTheFlag) {
  auto r = cohort::testing::run_process({COHORT_TRAINER_PATH, "--batch-size", "0"}, 30s);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--batch-size"), std::string::npos) << r.err;
  auto d = cohort::testing::run_process({COHORT_TRAINER_PATH, "--device", "tpu"}, 30s);
  EXPECT_EQ(d.exit_code, 2) << describe(d);
  EXPECT_NE(d.err.find("--device"), std::string::npos) << d.err;
  auto m = run_trainer(1, {"--data-dir", "/nonexistent/fmnist"});
  EXPECT_NE(m.exit_code, 0);
  EXPECT_NE(m.err.find("dataset-fashion-mnist"), std::string::npos) << describe(m);
}

// --pipeline-stages 2: the model cut in two stages on two ranks, 4 micro-batches per
// step, equals the plain trainer on one rank with the same batch (same samples, same
// steps; only the order of float sums differs). Python loads the assembled weights.
TEST(Trainer, TwoStagePipelineEqualsOneRankAndPythonLoadsItsWeights) {
  TempDir dir("cohort-trainer");
  const auto piped = dir.path + "/piped.pt", plain = dir.path + "/plain.pt", resaved = dir.path + "/resaved.pt";
  auto p = run_trainer(2, with(kQuick, {"--batch-size", "32", "--pipeline-stages", "2", "--microbatches", "4",
                                        "--pipeline-schedule", "zero-bubble", "--save-final", piped}));
  ASSERT_EQ(p.exit_code, 0) << describe(p);
  auto r = run_trainer(1, with(kQuick, {"--batch-size", "32", "--save-final", plain}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_LT(max_difference(piped, plain), 1e-5);
  EXPECT_NE(p.out.find("\"schedule\":\"zero-bubble\""), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("\"bubble_fraction_measured\""), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("\"peak_live_microbatches\""), std::string::npos) << p.out;
  auto py = cohort::testing::run_process(
      {COHORT_PYTHON_PATH, COHORT_CHECK_STATE_DICT_PATH, piped, "/usr/share/datasets/fashion-mnist", resaved}, 120s);
  ASSERT_EQ(py.exit_code, 0) << describe(py);
  EXPECT_NE(py.out.find(R"("keys": ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", )"),
            std::string::npos)
      << py.out;
}

// 4 ranks: 2 replicas of a 2-stage interleaved pipeline (2 virtual stages per rank),
// each stage under DDP, with recomputation: the same as the plain trainer on 2 ranks.
TEST(Trainer, TwoReplicasOfAPipelineEqualTwoPlainRanks) {
  TempDir dir("cohort-trainer");
  const auto piped = dir.path + "/piped.pt", plain = dir.path + "/plain.pt";
  auto p = run_trainer(4, with(kQuick, {"--batch-size", "16", "--pipeline-stages", "2", "--virtual-stages", "2",
                                        "--pipeline-schedule", "interleaved", "--microbatches", "4",
                                        "--activation-checkpointing", "--save-final", piped}));
  ASSERT_EQ(p.exit_code, 0) << describe(p);
  auto r = run_trainer(2, with(kQuick, {"--batch-size", "16", "--save-final", plain}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_LT(max_difference(piped, plain), 1e-5);
  EXPECT_NE(p.out.find("\"data_parallel_replicas\":2"), std::string::npos) << p.out;
}

// 130 samples over 2 replicas of a 2-stage pipeline: 65 each, batches of 32, 32 and 1
// rows, and 4 micro-batches per step. The 1-row batch cannot be cut, so every rank
// skips it alike (Note [Short last batch]); the epoch ends, is saved and resumes.
TEST(Trainer, PipelineSkipsALastBatchShorterThanItsMicroBatches) {
  TempDir dir("cohort-trainer");
  const auto data = cohort::testing::fashion_subset(dir.path, 130);
  const auto ckpt = dir.path + "/ckpt";
  const std::vector<std::string> args = {"--data-dir", data, "--batch-size", "32", "--pipeline-stages", "2",
                                         "--microbatches", "4", "--optimizer", "sgd", "--checkpoint-dir", ckpt};
  auto r = run_trainer(4, with(args, {"--epochs", "2"}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("skipping each epoch's last batch of 1 rows per replica"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"steps\":4,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"samples\":256"), std::string::npos) << r.out;
  auto more = run_trainer(4, with(args, {"--epochs", "3"}));
  ASSERT_EQ(more.exit_code, 0) << describe(more);
  EXPECT_NE(more.out.find("resuming from " + ckpt + "/stage-0/step-000000004"), std::string::npos) << more.out;
  EXPECT_NE(more.out.find("\"samples\":128"), std::string::npos) << more.out;
}

// Checkpoints cut for 2 stages cannot resume 4: every rank refuses, naming both
// layouts, and nothing in the directory moves (Note [Pipeline layouts]). The same
// layout then resumes from them.
TEST(Trainer, PipelineCheckpointsRefuseAnotherCutAndKeepTheirSteps) {
  TempDir dir("cohort-trainer");
  const auto data = cohort::testing::fashion_subset(dir.path, 256);
  const auto ckpt = dir.path + "/ckpt";
  const std::vector<std::string> args = {"--data-dir", data, "--epochs", "1", "--batch-size", "16",
                                         "--microbatches", "4", "--optimizer", "sgd", "--checkpoint-dir", ckpt,
                                         "--checkpoint-every", "1"};
  auto first = run_trainer(2, with(args, {"--pipeline-stages", "2", "--max-steps", "3"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(ckpt)) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto before = listing();
  ASSERT_FALSE(before.empty());
  auto other = run_trainer(4, with(args, {"--pipeline-stages", "4"}));
  EXPECT_NE(other.exit_code, 0) << describe(other);
  const std::string refusal =
      "were written by a pipeline of 2 stages (2 pipeline ranks x 1 virtual stages); this run has 4 stages (4 "
      "pipeline ranks x 1 virtual stages)";
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(other.err.find("[rank" + std::to_string(rank) + "]: error: cohort pipeline: the checkpoints in " + ckpt +
                             " " + refusal),
              std::string::npos)
        << describe(other);
  EXPECT_EQ(listing(), before);
  // Without a pipeline the stage checkpoints cannot resume either (issue 29, pipeline D4).
  auto plain = run_trainer(1, args);
  EXPECT_NE(plain.exit_code, 0) << describe(plain);
  EXPECT_NE(plain.err.find("error: cohort: the checkpoints in " + ckpt + " (stage-<s> directories) were written by "
                           "a pipeline of 2 stages (2 pipeline ranks x 1 virtual stages)"),
            std::string::npos)
      << describe(plain);
  EXPECT_EQ(listing(), before);
  auto again = run_trainer(2, with(args, {"--pipeline-stages", "2"}));
  ASSERT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_NE(again.out.find("resuming from " + ckpt + "/stage-0/step-000000003"), std::string::npos) << again.out;
}

// bf16 autocast on the CPU trains as float32 does: from the same seed, a fraction of
// an epoch at world 2 (150 steps of 2 x 32 samples, 9 600 of the 60 000) in bf16 ends
// at a test accuracy far above chance (0.10) and within kBf16AccuracyGap of float32's,
// and its weights are not float32's (autocast ran). A bf16 path that stopped training
// (a lost gradient, a NaN, weights kept in bf16) falls to chance or far behind.
// Note [Tests sized for a slow, busy machine]: this test trained 2 whole epochs twice
// and ran past CTest's timeout on a VM with a third of the development VM's GEMM rate
// and a build beside it (issue 46); the claim "2 epochs in bf16 reach float32's
// accuracy within a point" is now a benchmark (benchmarks/bf16_accuracy.sh,
// BENCHMARKS.md), and this test only shows that bf16 trains like float32.
constexpr double kBf16AccuracyGap = 0.03;

TEST(Trainer, Bf16AutocastTrainsLikeFloat32OverAFractionOfAnEpoch) {
  TempDir dir("cohort-trainer");
  const auto f32 = dir.path + "/fp32.pt", b16 = dir.path + "/bf16.pt";
  const std::vector<std::string> args = {"--epochs", "1", "--limit-train-batches", "150", "--seed", "4"};
  auto fp32 = run_trainer(2, with(args, {"--save-final", f32}));
  ASSERT_EQ(fp32.exit_code, 0) << describe(fp32);
  auto bf16 = run_trainer(2, with(args, {"--amp", "bf16", "--save-final", b16}));
  ASSERT_EQ(bf16.exit_code, 0) << describe(bf16);
  EXPECT_NE(bf16.out.find("\"amp\":\"bf16\""), std::string::npos) << bf16.out;
  EXPECT_FALSE(bitwise_equal(f32, b16)) << "--amp bf16 changed nothing";
  auto accuracy = [](const std::string& out) {
    const auto at = out.rfind("\"test_accuracy\":");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 16));
  };
  const double a32 = accuracy(fp32.out), a16 = accuracy(bf16.out);
  std::cout << "test accuracy after 150 steps: float32 " << a32 << ", bf16 " << a16 << std::endl;
  EXPECT_GT(a32, 0.7) << fp32.out;
  EXPECT_GT(a16, 0.7) << bf16.out;
  EXPECT_LT(std::abs(a16 - a32), kBf16AccuracyGap) << "float32 " << a32 << ", bf16 " << a16;
}

// --activation-checkpointing recomputes the convolution blocks in backward: the same
// ops on the same values, so the weights are bitwise those of a run without it.
TEST(Trainer, ActivationCheckpointingChangesNoWeight) {
  TempDir dir("cohort-trainer");
  const auto plain = dir.path + "/plain.pt", recomputed = dir.path + "/recomputed.pt";
  auto a = run_trainer(2, with(kQuick, {"--save-final", plain}));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  auto b = run_trainer(2, with(kQuick, {"--activation-checkpointing", "--save-final", recomputed}));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_TRUE(bitwise_equal(plain, recomputed)) << "largest difference " << max_difference(plain, recomputed);
}

namespace {
// The values of `"name":` in the trainer's final JSON line, one per rank.
std::vector<long long> per_rank(const std::string& out, const std::string& name) {
  std::vector<long long> bytes;
  const std::string key = "\"" + name + "\":";
  for (auto at = out.find(key); at != std::string::npos; at = out.find(key, at + 1))
    bytes.push_back(std::stoll(out.substr(at + key.size())));
  return bytes;
}
}  // namespace

// --zero 1 and 2 (docs/zero.md): the optimizer's state (and at stage 2 the
// gradients, reduced to their owners without DDP) sharded over the ranks changes no
// weight: two ranks add two values, the same in either order, so stage 2 is bitwise
// DDP too. Each rank holds its part, which the final JSON reports; the checkpoints
// (each rank writes its shard) consolidate into one file that Python loads, and
// resume at another world size.
class TrainerZero : public ::testing::TestWithParam<int> {};

TEST_P(TrainerZero, ChangesNoWeightShardsAndResumesAtAnotherWorldSize) {
  const auto stage = std::to_string(GetParam());
  TempDir dir("cohort-trainer");
  const auto data = cohort::testing::fashion_subset(dir.path, 1000);
  // SGD with momentum: world 1 x 32 and world 2 x 16 agree within float rounding
  // (Adam's normalisation would magnify the rounding of near-zero gradients).
  const std::vector<std::string> args = {"--data-dir", data, "--epochs", "1", "--optimizer", "sgd", "--lr", "0.05",
                                         "--seed", "4"};
  const auto plain = dir.path + "/plain.pt", sharded = dir.path + "/sharded.pt", resumed = dir.path + "/resumed.pt";
  auto a = run_trainer(2, with(args, {"--batch-size", "16", "--save-final", plain}));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  auto b = run_trainer(2, with(args, {"--batch-size", "16", "--zero", stage, "--save-final", sharded}));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_TRUE(bitwise_equal(plain, sharded)) << "largest difference " << max_difference(plain, sharded);
  // Per rank: the whole of it without ZeRO; with it, two shards that add up to it.
  std::vector<std::string> sharded_kinds = {"optimizer_state_bytes"};
  if (stage == "2") sharded_kinds.push_back("gradient_bytes");
  for (const auto& name : sharded_kinds) {
    const auto whole = per_rank(a.out, name), shards = per_rank(b.out, name);
    ASSERT_EQ(whole.size(), 2u) << a.out;
    ASSERT_EQ(shards.size(), 2u) << b.out;
    EXPECT_EQ(whole[0], whole[1]) << name;
    EXPECT_EQ(shards[0] + shards[1], whole[0]) << name;
    EXPECT_GT(shards[0], 0) << name;
    EXPECT_GT(shards[1], 0) << name;
  }
  if (stage == "2") {
    EXPECT_NE(b.out.find("\"comm_hook\":\"zero2_reduce_to_owners\""), std::string::npos) << b.out;
  }

  // Stopped at step 10 by two ranks, resumed by one with twice the batch.
  const auto ckpt = dir.path + "/ckpt";
  auto first = run_trainer(2, with(args, {"--batch-size", "16", "--zero", stage, "--checkpoint-dir", ckpt,
                                          "--max-steps", "10"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  // Each rank wrote its own shard (docs/zero.md#sharded-checkpoints); one file of them
  // loads in Python with weights_only=True.
  const auto step10 = ckpt + "/step-000000010";
  EXPECT_FALSE(std::filesystem::exists(step10 + "/optimizer.pt"));
  EXPECT_TRUE(std::filesystem::exists(step10 + "/optimizer-shard-00001-of-00002.pt"));
  const auto consolidated = dir.path + "/consolidated.pt";
  auto merged = cohort::testing::run_process({COHORT_CLI_PATH, "checkpoint", "consolidate", ckpt, consolidated}, 60s);
  ASSERT_EQ(merged.exit_code, 0) << describe(merged);
  EXPECT_NE(merged.out.find("2 optimizer file(s)"), std::string::npos) << merged.out;
  auto python = cohort::testing::run_process(
      {COHORT_PYTHON_PATH, COHORT_CHECK_CONSOLIDATED_PATH, consolidated, step10 + "/model.pt", "10"}, 120s);
  ASSERT_EQ(python.exit_code, 0) << describe(python);
  auto missing = cohort::testing::run_process(
      {COHORT_CLI_PATH, "checkpoint", "consolidate", dir.path + "/nowhere", consolidated}, 60s);
  EXPECT_EQ(missing.exit_code, 1) << describe(missing);
  EXPECT_NE(missing.err.find(dir.path + "/nowhere is not a directory"), std::string::npos) << describe(missing);
  auto usage = cohort::testing::run_process({COHORT_CLI_PATH, "checkpoint", "merge", ckpt}, 60s);
  EXPECT_EQ(usage.exit_code, 2) << describe(usage);
  auto second = run_trainer(1, with(args, {"--batch-size", "32", "--zero", stage, "--checkpoint-dir", ckpt,
                                           "--save-final", resumed}));
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resuming from " + ckpt + "/step-000000010"), std::string::npos) << second.out;
  EXPECT_LT(max_difference(plain, resumed), kAcrossWorldSizes);  // Note [Rounding across world sizes]
}

INSTANTIATE_TEST_SUITE_P(Stages, TrainerZero, ::testing::Values(1, 2),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

// --zero 3 (docs/zero.md#zero-3-sharded-parameters): every layer a fully sharded
// unit. Two ranks add two values, the same in either order, so the weights are
// bitwise DDP's (with the contiguous layout --zero 3 uses). Each rank holds half of
// the parameters and of the optimizer's state; the checkpoint holds the whole model
// and state, as DDP's does, so it resumes at world 1 fully sharded, and under DDP.
// With --activation-checkpointing the units are gathered again for the recompute;
// under --amp bf16 it is still bitwise DDP under --amp bf16.
// Nine runs: each on 512 training and 1 000 test images, since evaluating the whole
// test set after each was most of this test's time (124 s on a busy 2-core VM; Note
// [Tests sized for a slow, busy machine]).
TEST(Trainer, ZeroThreeIsBitwiseDdpShardsTheParametersAndResumes) {
  TempDir dir("cohort-trainer");
  const auto plain = dir.path + "/plain.pt", sharded = dir.path + "/sharded.pt";
  const auto quick = with(kQuick, {"--data-dir", cohort::testing::fashion_subset(dir.path, 512, 1000)});
  const auto contiguous = with(quick, {"--memory-format", "contiguous", "--batch-size", "16"});
  auto a = run_trainer(2, with(contiguous, {"--save-final", plain}));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  auto b = run_trainer(2, with(quick, {"--batch-size", "16", "--zero", "3", "--save-final", sharded}));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_TRUE(bitwise_equal(plain, sharded)) << "largest difference " << max_difference(plain, sharded);
  EXPECT_NE(b.out.find("\"comm_hook\":\"zero3_reduce_scatter\""), std::string::npos) << b.out;
  for (const std::string name : {"parameter_bytes", "optimizer_state_bytes", "gradient_bytes"}) {
    const auto whole = per_rank(a.out, name), shards = per_rank(b.out, name);
    ASSERT_EQ(whole.size(), 2u) << a.out;
    ASSERT_EQ(shards.size(), 2u) << b.out;
    // Each flat is padded to an even split: at most one element (4 bytes per
    // tensor of state) more per layer.
    EXPECT_GE(shards[0] + shards[1], whole[0]) << name;
    EXPECT_LE(shards[0] + shards[1], whole[0] + 4 * 4 * 2) << name;
    EXPECT_LE(shards[0], whole[0] / 2 + 4 * 4 * 2) << name;
  }
  const auto recomputed = dir.path + "/recomputed.pt";
  auto c = run_trainer(2, with(quick, {"--batch-size", "16", "--zero", "3", "--activation-checkpointing",
                                        "--save-final", recomputed}));
  ASSERT_EQ(c.exit_code, 0) << describe(c);
  EXPECT_TRUE(bitwise_equal(sharded, recomputed)) << "largest difference " << max_difference(sharded, recomputed);
  // Under bf16 autocast too: the same casts of the same (gathered) weights as DDP's.
  const auto ddp_bf16 = dir.path + "/ddp_bf16.pt", zero3_bf16 = dir.path + "/zero3_bf16.pt";
  auto d = run_trainer(2, with(contiguous, {"--amp", "bf16", "--save-final", ddp_bf16}));
  ASSERT_EQ(d.exit_code, 0) << describe(d);
  auto e = run_trainer(2, with(quick, {"--batch-size", "16", "--zero", "3", "--amp", "bf16", "--save-final",
                                        zero3_bf16}));
  ASSERT_EQ(e.exit_code, 0) << describe(e);
  EXPECT_TRUE(bitwise_equal(ddp_bf16, zero3_bf16)) << "largest difference " << max_difference(ddp_bf16, zero3_bf16);
  EXPECT_FALSE(bitwise_equal(sharded, zero3_bf16)) << "--amp bf16 changed nothing";

  // Stopped at step 5 by two ranks; resumed by one rank fully sharded, and by one
  // rank under DDP, with twice the batch: both end near the uninterrupted run.
  for (const std::string resume_zero : {"3", "0"}) {
    const auto ckpt = dir.path + "/ckpt" + resume_zero;
    auto first = run_trainer(2, with(quick, {"--batch-size", "16", "--zero", "3", "--checkpoint-dir", ckpt,
                                              "--max-steps", "5"}));
    ASSERT_EQ(first.exit_code, 0) << describe(first);
    const auto resumed = dir.path + "/resumed" + resume_zero + ".pt";
    auto second = run_trainer(1, with(quick, {"--batch-size", "32", "--zero", resume_zero, "--memory-format",
                                               "contiguous", "--checkpoint-dir", ckpt, "--save-final", resumed}));
    ASSERT_EQ(second.exit_code, 0) << describe(second);
    EXPECT_NE(second.out.find("resuming from " + ckpt + "/step-000000005"), std::string::npos) << second.out;
    EXPECT_LT(max_difference(plain, resumed), kAcrossWorldSizes) << "resumed with --zero " << resume_zero;
  }
}

// --comm-hook powersgd (docs/ddp.md#powersgd): before its start iteration bitwise
// the plain all-reduce; after it, fewer elements sent and other weights; stopped and
// resumed from a checkpoint (error memories, warm-start Qs, generator), bitwise the
// run never stopped.
TEST(Trainer, PowerSgdBeforeItsStartIsBitwiseAllReduceAndTrainsAfter) {
  TempDir dir("cohort-trainer");
  const auto plain = dir.path + "/plain.pt", late = dir.path + "/late.pt", early = dir.path + "/early.pt",
             resumed = dir.path + "/resumed.pt";
  auto a = run_trainer(2, with(kQuick, {"--deterministic", "--save-final", plain}));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  auto b = run_trainer(2, with(kQuick, {"--deterministic", "--comm-hook", "powersgd:2", "--powersgd-start", "1000",
                                        "--save-final", late}));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_TRUE(bitwise_equal(plain, late)) << "largest difference " << max_difference(plain, late);

  const std::vector<std::string> powersgd = {"--deterministic", "--comm-hook", "powersgd:2", "--powersgd-start", "2"};
  auto c = run_trainer(2, with(with(kQuick, powersgd), {"--save-final", early}));
  ASSERT_EQ(c.exit_code, 0) << describe(c);
  EXPECT_GT(max_difference(plain, early), 0) << "compression changed nothing";
  auto number = [](const std::string& out, const std::string& key) {
    auto at = out.find("\"" + key + "\":");
    return at == std::string::npos ? -1LL : std::stoll(out.substr(at + key.size() + 3));
  };
  const auto sent = number(c.out, "elements_sent_last_step"), dense = number(c.out, "elements_of_plain_all_reduce");
  EXPECT_GT(sent, 0) << c.out;
  EXPECT_LT(sent * 4, dense) << c.out;

  const auto ckpt = dir.path + "/ckpt";
  auto first = run_trainer(2, with(with(kQuick, powersgd), {"--checkpoint-dir", ckpt, "--max-steps", "5"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto second = run_trainer(2, with(with(kQuick, powersgd), {"--checkpoint-dir", ckpt, "--save-final", resumed}));
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resuming from " + ckpt + "/step-000000005"), std::string::npos) << second.out;
  EXPECT_TRUE(bitwise_equal(early, resumed)) << "largest difference " << max_difference(early, resumed);
}

// ZeRO-1 under DDP with PowerSGD as DDP's hook, as users combine them: compression
// changes the weights against plain --zero 1, and a run stopped at step 5 (a sharded
// checkpoint with the hook's error memories) resumes bitwise the run never stopped.
TEST(Trainer, ZeroOneWithPowerSgdResumesBitwise) {
  TempDir dir("cohort-trainer");
  const auto plain = dir.path + "/plain.pt", whole = dir.path + "/whole.pt", resumed = dir.path + "/resumed.pt";
  const std::vector<std::string> zero = {"--deterministic", "--zero", "1"};
  const std::vector<std::string> powersgd = {"--comm-hook", "powersgd:2", "--powersgd-start", "2"};
  auto a = run_trainer(2, with(with(kQuick, zero), {"--save-final", plain}));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  auto b = run_trainer(2, with(with(with(kQuick, zero), powersgd), {"--save-final", whole}));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_GT(max_difference(plain, whole), 0) << "compression changed nothing";
  const auto ckpt = dir.path + "/ckpt";
  auto first = run_trainer(2, with(with(with(kQuick, zero), powersgd), {"--checkpoint-dir", ckpt, "--max-steps", "5"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-000000005/optimizer-shard-00000-of-00002.pt"));
  auto second =
      run_trainer(2, with(with(with(kQuick, zero), powersgd), {"--checkpoint-dir", ckpt, "--save-final", resumed}));
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resuming from " + ckpt + "/step-000000005"), std::string::npos) << second.out;
  EXPECT_TRUE(bitwise_equal(whole, resumed)) << "largest difference " << max_difference(whole, resumed);
}

TEST(Trainer, ZeroAndCommHookFlagsThatCannotWorkExitTwo) {
  for (const auto& extra : std::vector<std::vector<std::string>>{{"--zero", "3", "--memory-format", "channels-last"},
                                                                  {"--zero", "3", "--comm-hook", "powersgd"},
                                                                  {"--zero", "3", "--pipeline-stages", "2"},
                                                                  {"--zero", "2", "--comm-hook", "fp16"},
                                                                  {"--zero", "2", "--pipeline-stages", "2"},
                                                                  {"--zero", "1", "--pipeline-stages", "2"},
                                                                  {"--zero", "1", "--data-parallel-replicas", "2"},
                                                                  {"--comm-hook", "powersgd:0"},
                                                                  {"--comm-hook", "fp16:2"},
                                                                  {"--comm-hook", "zip"}}) {
    std::vector<std::string> argv{COHORT_TRAINER_PATH};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto r = cohort::testing::run_process(argv, 30s);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find(extra[0]), std::string::npos) << describe(r);
  }
}

// --data-parallel-replicas 3: one process, three CPU replicas splitting each batch of
// 32 (11, 11 and 10 rows), equals one process without replicas on the same batches;
// so do two replicas that recompute their convolutions.
TEST(Trainer, ReplicasInOneProcessEqualOneModule) {
  TempDir dir("cohort-trainer");
  const auto plain = dir.path + "/plain.pt", replicated = dir.path + "/replicated.pt";
  auto a = run_trainer(1, with(kQuick, {"--batch-size", "32", "--save-final", plain}));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  auto b = run_trainer(1, with(kQuick, {"--batch-size", "32", "--data-parallel-replicas", "3", "--save-final",
                                        replicated}));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_LT(max_difference(plain, replicated), 1e-5);
  // Composed with activation checkpointing inside each replica.
  const auto recomputed = dir.path + "/recomputed.pt";
  auto c = run_trainer(1, with(kQuick, {"--batch-size", "32", "--data-parallel-replicas", "2",
                                        "--activation-checkpointing", "--save-final", recomputed}));
  ASSERT_EQ(c.exit_code, 0) << describe(c);
  EXPECT_LT(max_difference(plain, recomputed), 1e-5);
  // DataParallel is one process: two ranks are refused, on every rank.
  auto two = run_trainer(2, with(kQuick, {"--data-parallel-replicas", "2"}));
  EXPECT_NE(two.exit_code, 0) << describe(two);
  EXPECT_NE(two.err.find("--data-parallel-replicas runs one process, but this job has 2 ranks"), std::string::npos)
      << describe(two);
}

// --amp bf16 composes with pipelines: two stages under autocast end within bfloat16's
// rounding of one rank under autocast (micro-batching changes the sums' order).
TEST(Trainer, Bf16PipelineMatchesBf16OnOneRank) {
  TempDir dir("cohort-trainer");
  const auto piped = dir.path + "/piped.pt", plain = dir.path + "/plain.pt";
  auto p = run_trainer(2, with(kQuick, {"--batch-size", "32", "--pipeline-stages", "2", "--microbatches", "4",
                                        "--amp", "bf16", "--save-final", piped}));
  ASSERT_EQ(p.exit_code, 0) << describe(p);
  auto r = run_trainer(1, with(kQuick, {"--batch-size", "32", "--amp", "bf16", "--save-final", plain}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_LT(max_difference(piped, plain), 1e-3);
}

TEST(Trainer, AmpFlagsThatCannotWorkExitTwo) {
  auto fp16 = cohort::testing::run_process({COHORT_TRAINER_PATH, "--amp", "fp16"}, 30s);
  EXPECT_EQ(fp16.exit_code, 2) << describe(fp16);
  EXPECT_NE(fp16.err.find("--amp fp16 needs --device cuda"), std::string::npos) << fp16.err;
  auto bad = cohort::testing::run_process({COHORT_TRAINER_PATH, "--amp", "fp8"}, 30s);
  EXPECT_EQ(bad.exit_code, 2) << describe(bad);
  EXPECT_NE(bad.err.find("--amp"), std::string::npos) << bad.err;
}

TEST(Trainer, DeviceCudaSaysWhatIsMissing) {
  const auto cuda = cohort::system::detect_cuda();
  auto r = run_trainer(1, with(kQuick, {"--device", "cuda"}));
  if (cuda.visible_gpus > 0) {
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return;
  }
  // A ConfigError: the job ends with 2 (Note [A job that ends on a configuration error]).
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--device cuda: no CUDA device is usable: " + cuda.why_no_gpu()), std::string::npos)
      << r.err;
#ifdef COHORT_HAVE_NCCL
  EXPECT_NE(r.err.find("this LibTorch has CUDA (runtime "), std::string::npos) << r.err;
#else
  EXPECT_NE(r.err.find("this LibTorch was built without CUDA"), std::string::npos) << r.err;
#endif
}

TEST(Trainer, CudaGraphsFlagsThatCannotWorkExitTwo) {
  // Note [What a captured step composes with] (examples/fashion_mnist/cuda_graphs.h).
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--device", "cpu"}, "--cuda-graphs with --device cpu: CUDA graphs capture CUDA kernels"},
      {{"--device", "cuda", "--zero", "1"}, "--cuda-graphs with --zero 1: the sharded optimizers are not capturable"},
      {{"--device", "cuda", "--amp", "fp16"}, "--cuda-graphs with --amp fp16: the GradScaler reads on the host"},
      {{"--device", "cuda", "--comm-hook", "powersgd"}, "--cuda-graphs with --comm-hook powersgd"},
      {{"--device", "cuda", "--pipeline-stages", "2"}, "--cuda-graphs with --pipeline-stages"},
      {{"--device", "cuda", "--data-parallel-replicas", "2"}, "--cuda-graphs with --data-parallel-replicas"},
      {{"--device", "cuda", "--activation-checkpointing"}, "--cuda-graphs with --activation-checkpointing"},
      {{"--device", "cuda", "--optimizer-kernel", "foreach"},
       "--cuda-graphs with --optimizer-kernel foreach: only the fused kernels"},
      {{"--device", "cuda", "--fault-tolerance"}, "--cuda-graphs with --fault-tolerance"},
  };
  for (const auto& [flags, why] : refused) {
    std::vector<std::string> argv = {COHORT_TRAINER_PATH, "--cuda-graphs"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto r = cohort::testing::run_process(argv, 30s);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find(why), std::string::npos) << why << "\n" << r.err;
  }
}

TEST(Trainer, CudaGraphsWithoutAGpuSayWhy) {
  // Without a GPU, --device auto lands on the CPU after the flags were accepted: the
  // trainer says why the step cannot be captured, by this LibTorch's kind.
  auto r = run_trainer(1, with(kQuick, {"--device", "auto", "--cuda-graphs"}));
  if (cohort::system::detect_cuda().visible_gpus > 0) {  // auto is the GPU: the step is captured
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("\"cuda_graphs\":true"), std::string::npos) << r.out;
    return;
  }
  EXPECT_EQ(r.exit_code, 2) << describe(r);
#ifdef COHORT_HAVE_NCCL
  EXPECT_NE(r.err.find("--cuda-graphs: CUDA graphs capture CUDA kernels, and the step runs on cpu"), std::string::npos)
      << r.err;
#else
  EXPECT_NE(r.err.find("--cuda-graphs: this LibTorch has no CUDA"), std::string::npos) << r.err;
#endif
}

TEST(Trainer, PipelineFlagsThatCannotWorkExitTwo) {
  auto bad = cohort::testing::run_process({COHORT_TRAINER_PATH, "--pipeline-schedule", "gpipe"}, 30s);
  EXPECT_EQ(bad.exit_code, 2) << describe(bad);
  EXPECT_NE(bad.err.find("need --pipeline-stages 2 or more"), std::string::npos) << bad.err;
  auto many = cohort::testing::run_process({COHORT_TRAINER_PATH, "--pipeline-stages", "4", "--virtual-stages", "2"}, 30s);
  EXPECT_EQ(many.exit_code, 2) << describe(many);
  EXPECT_NE(many.err.find("asks for 8 stages"), std::string::npos) << many.err;
  // 3 processes cannot form pipelines of 2 stages: every rank says so.
  auto odd = run_trainer(3, with(kQuick, {"--pipeline-stages", "2"}));
  EXPECT_NE(odd.exit_code, 0) << describe(odd);
  EXPECT_NE((odd.out + odd.err).find("3 ranks cannot form pipelines of 2 stages"), std::string::npos) << describe(odd);
}


namespace {

// --fault-tolerance (docs/fault_tolerance.md): one of two replicas is killed with
// SIGKILL while they train; the other redoes the step in flight and goes on, and
// the final weights equal one process training the same global batches
// (Note [A global batch per step]): no step lost, none applied twice. `extra` goes
// to both runs; the survivor's weights are written to `survived`, and the one
// process's to `alone`. When `a_step_shows` is false, the tolerance is wider than
// one step's change (bfloat16's rounding of split batches), and only the step
// counters prove that no step was lost or applied twice. `job` sizes the
// fault-tolerant job and names the rank killed; rank 0 must survive (it reports).
struct FaultTolerantJob {
  int ranks = 2;   // each trains 64 / ranks samples of the global batch of 64
  int victim = 1;
  std::vector<std::string> args;      // for the job only, not the one process
  std::vector<std::string> launcher;  // more flags for `cohort run` (a rendezvous)
  std::map<std::string, std::string> env;  // more for the job's environment
  // Lines that the agents' output must hold, and lines it must not.
  std::vector<std::string> err_has, err_lacks;
};

void lose_a_replica(const TempDir& dir, const std::vector<std::string>& extra, const std::string& alone,
                    const std::string& survived, double tolerance, bool a_step_shows = true,
                    FaultTolerantJob shape = {}) {
  // 40 steps: long enough for the kill to land mid-run, short enough that rounding
  // (two halves summed, not one batch) stays within the tolerance.
  std::vector<std::string> args = {"--fault-tolerance", "--epochs", "1",   "--limit-train-batches", "40",
                                   "--optimizer",       "sgd",      "--lr", "0.02", "--seed", "11", "--schedule", "constant",
                                   "--memory-format",   "contiguous"};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto one_step_short = dir.path + "/short.pt";
  // One process, global batch 64: what two replicas of --batch-size 32 train together.
  auto one = cohort::testing::run_process(
      with({COHORT_TRAINER_PATH, "--batch-size", "64", "--save-final", alone}, args), 240s, {{"OMP_NUM_THREADS", "1"}});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  auto short_run = cohort::testing::run_process(
      with({COHORT_TRAINER_PATH, "--batch-size", "64", "--max-steps", "39", "--save-final", one_step_short}, args), 240s,
      {{"OMP_NUM_THREADS", "1"}});
  ASSERT_EQ(short_run.exit_code, 0) << describe(short_run);
  // The bound below could tell a lost step.
  if (a_step_shows) {
    ASSERT_GT(max_difference(alone, one_step_short), 10 * tolerance);
  }

  std::vector<std::string> argv{COHORT_CLI_PATH, "run"};
  argv.insert(argv.end(), shape.launcher.begin(), shape.launcher.end());
  const std::vector<std::string> job_args{"--nproc-per-node", std::to_string(shape.ranks), "--fault-tolerance",
                                          "in-process",        "--max-restarts",            "1",
                                          "--stop-timeout",    "3",                         COHORT_TRAINER_PATH,
                                          "--batch-size",      std::to_string(64 / shape.ranks), "--save-final",
                                          survived};
  argv.insert(argv.end(), job_args.begin(), job_args.end());
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), shape.args.begin(), shape.args.end());
  std::map<std::string, std::string> env{
      {"OMP_NUM_THREADS", "1"}, {"COHORT_FT_COLLECTIVE_TIMEOUT", "10"}, {"COHORT_FT_QUORUM_TIMEOUT", "3"}};
  env.insert(shape.env.begin(), shape.env.end());
  cohort::testing::Subprocess job(argv, env);
  std::smatch m;
  const auto victim = std::to_string(shape.victim);
  const std::regex started("replica " + victim + ": incarnation 0 pid (\\d+)[\\s\\S]*replica " + victim +
                           ": training in quorum 1");
  ASSERT_TRUE(job.read_until([&](const std::string& out) { return std::regex_search(out, m, started); }, 120s))
      << job.out() << job.err();
  ::kill(std::stoi(m[1]), SIGKILL);
  auto r = job.finish(240s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("worker " + victim + " (incarnation 0"), std::string::npos) << describe(r);
  for (const auto& line : shape.err_has) EXPECT_NE(r.err.find(line), std::string::npos) << line << "\n" << describe(r);
  for (const auto& line : shape.err_lacks) EXPECT_EQ(r.err.find(line), std::string::npos) << line << "\n" << describe(r);
  // Replica 0 never died: it committed every step once, and redid the one in flight.
  std::smatch s;
  ASSERT_TRUE(std::regex_search(r.out, s, std::regex(R"("aborted_steps":(\d+),"committed_here":(\d+))"))) << describe(r);
  EXPECT_GE(std::stoi(s[1]), 1) << describe(r);
  EXPECT_EQ(std::stoi(s[2]), 40) << describe(r);
  EXPECT_NE(r.out.find("\"steps\":40"), std::string::npos) << describe(r);
  EXPECT_LT(max_difference(alone, survived), tolerance);
}

TEST(Trainer, FaultTolerantRunLosesAReplicaAndEndsAtTheOneProcessWeights) {
  TempDir dir("cohort-trainer");
  lose_a_replica(dir, {}, dir.path + "/alone.pt", dir.path + "/survived.pt", kAcrossWorldSizes);
}

// The same job under the elastic agent (--rdzv-backend c10d, Note [Held rounds] in
// elastic/rendezvous_state.h) rather than the static rendezvous: the agent hosts
// cohort's store, restarts only the dead worker in the same round, and the survivor
// ends at the one-process weights, as under the static one.
TEST(Trainer, FaultTolerantRunUnderTheElasticAgentLosesAReplicaAndEndsAtTheOneProcessWeights) {
  TempDir dir("cohort-trainer");
  const auto port = std::to_string(cohort::testing::free_port());
  FaultTolerantJob shape;
  shape.launcher = {"--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + port, "--rdzv-id",
                    "trainer-ft" + port, "--rdzv-conf", "join_timeout=60,last_call_timeout=1,keep_alive_interval=0.5"};
  shape.env = {{"COHORT_RDZV_TOKEN", "trainer-ft-elastic-token-5d20a9"}};
  shape.err_has = {"this agent hosts the rendezvous store", "restarting only this worker"};
  shape.err_lacks = {"restarting the workers", "round 1"};
  lose_a_replica(dir, {}, dir.path + "/alone.pt", dir.path + "/survived.pt", kAcrossWorldSizes, true, shape);
}

// --zero 2 --shards-per-replica 2 (docs/fault_tolerance.md, "ZeRO inside a
// replica"): four ranks, two replicas that each shard the optimizer state and the
// gradients over their two ranks. Rank 3 is killed: its replica is left out until
// the replacement comes, both its ranks then take their shard from replica 0, and
// rank 0 commits every step once and ends at the one-process weights: within 3e-4,
// as the gradients are summed in two levels (inside a replica, then across), in
// another order than one process's (1.5e-4 apart on LibTorch 2.11, under 1e-4 on
// 1.13); the last step alone moves them by 0.012.
TEST(Trainer, FaultTolerantZero2RunLosesARankAndEndsAtTheOneProcessWeights) {
  TempDir dir("cohort-trainer");
  lose_a_replica(dir, {}, dir.path + "/alone.pt", dir.path + "/survived.pt", 3e-4, true,
                 FaultTolerantJob{4, 3, {"--zero", "2", "--shards-per-replica", "2"}});
}

// --amp bf16 composes with --fault-tolerance (autocast keeps no state): the
// survivor commits each of the 40 steps once and ends near one process under
// autocast, and autocast did run (the weights are not float32's). "Near": two
// halves of a batch rounded to bfloat16 apart are not the whole batch rounded once,
// and over 40 steps that drifted 0.022 here, about one step's change (0.01-0.02),
// so the weights cannot tell a lost step; the counters do.
TEST(Trainer, FaultTolerantRunUnderBf16AutocastLosesAReplicaAndEndsNearTheOneProcessWeights) {
  TempDir dir("cohort-trainer");
  const auto alone = dir.path + "/alone.pt", survived = dir.path + "/survived.pt";
  lose_a_replica(dir, {"--amp", "bf16"}, alone, survived, 0.1, /*a_step_shows=*/false);
  if (::testing::Test::HasFatalFailure()) return;
  const auto fp32 = dir.path + "/fp32.pt";
  auto r = cohort::testing::run_process({COHORT_TRAINER_PATH, "--batch-size", "64", "--epochs", "1",
                                         "--limit-train-batches", "40", "--optimizer", "sgd", "--lr", "0.02", "--seed",
                                         "11", "--schedule", "constant", "--memory-format", "contiguous",
                                         "--fault-tolerance", "--save-final", fp32},
                                        240s, {{"OMP_NUM_THREADS", "1"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("\"amp\":\"off\""), std::string::npos) << describe(r);
  EXPECT_FALSE(bitwise_equal(fp32, alone)) << "--amp bf16 changed nothing";
  EXPECT_GT(max_difference(fp32, survived), 0.0);
}

// Note [Every member writes the final weights] (examples/fashion_mnist/
// fault_tolerant.cpp): the quorum's rank 0 is killed as soon as it reports the last
// step, before it has scored the test set. Every member writes --save-final, so the
// survivor's file is there, at the one-process weights; the replacement finds
// training finished and exits 0. Before, only rank 0 wrote it, and the job exited
// 0 with no weights (found by review).
TEST(Trainer, FaultTolerantRunWritesTheFinalWeightsWhenRankZeroDiesAfterTheLastStep) {
  TempDir dir("cohort-trainer");
  const std::vector<std::string> args = {"--fault-tolerance", "--epochs", "1",   "--limit-train-batches", "20",
                                         "--optimizer",       "sgd",      "--lr", "0.02", "--seed", "3", "--schedule",
                                         "constant",          "--memory-format", "contiguous"};
  const auto alone = dir.path + "/alone.pt", final_weights = dir.path + "/final.pt";
  auto one = cohort::testing::run_process(
      with({COHORT_TRAINER_PATH, "--batch-size", "64", "--save-final", alone}, args), 240s, {{"OMP_NUM_THREADS", "1"}});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  std::vector<std::string> argv{COHORT_CLI_PATH,     "run",        "--nproc-per-node", "2",  "--fault-tolerance",
                                "in-process",        "--max-restarts", "1",            "--stop-timeout", "3",
                                COHORT_TRAINER_PATH, "--batch-size", "32", "--save-final", final_weights};
  argv.insert(argv.end(), args.begin(), args.end());
  cohort::testing::Subprocess job(argv, {{"OMP_NUM_THREADS", "1"}, {"COHORT_FT_COLLECTIVE_TIMEOUT", "10"},
                                         {"COHORT_FT_QUORUM_TIMEOUT", "3"}});
  std::smatch m;
  // Rank 0 of the only quorum is replica 0; its pid is in its first line.
  const std::regex last(R"(replica 0: incarnation 0 pid (\d+)[\s\S]*step 20/20)");
  ASSERT_TRUE(job.read_until([&](const std::string& out) { return std::regex_search(out, m, last); }, 120s))
      << job.out() << job.err();
  ::kill(std::stoi(m[1]), SIGKILL);
  auto r = job.finish(240s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("worker 0 (incarnation 0"), std::string::npos) << "rank 0 was not killed\n" << describe(r);
  ASSERT_TRUE(fs::exists(final_weights)) << "no --save-final after rank 0 died past the last step\n" << describe(r);
  EXPECT_LT(max_difference(alone, final_weights), kAcrossWorldSizes);
}

// Every replica lost (the job stopped): a new job of fault-tolerant replicas finds
// no live state, loads the newest checkpoint from disk and goes on from its step.
// `shape.args` go to both jobs (not the one process), which run `shape.ranks` ranks.
void resume_from_disk(const TempDir& dir, const FaultTolerantJob& shape) {
  // On the 1 920 images they train and 1 000 test images, so that the evaluation after
  // each of the three runs is short (Note [Tests sized for a slow, busy machine]).
  const std::vector<std::string> args = {"--fault-tolerance", "--epochs", "1",   "--limit-train-batches", "30",
                                         "--optimizer",       "sgd",      "--lr", "0.02", "--seed", "5", "--schedule", "constant",
                                         "--memory-format",   "contiguous", "--data-dir",
                                         cohort::testing::fashion_subset(dir.path, 30 * 64, 1000)};
  const auto alone = dir.path + "/alone.pt", resumed = dir.path + "/resumed.pt", ckpt = dir.path + "/ckpt";
  auto one = cohort::testing::run_process(
      with({COHORT_TRAINER_PATH, "--batch-size", "64", "--save-final", alone}, args), 240s, {{"OMP_NUM_THREADS", "1"}});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  auto job = [&](const std::vector<std::string>& more) {
    std::vector<std::string> argv{COHORT_CLI_PATH,     "run",          "--nproc-per-node", std::to_string(shape.ranks),
                                  "--fault-tolerance", "in-process",   COHORT_TRAINER_PATH, "--batch-size",
                                  std::to_string(64 / shape.ranks),    "--checkpoint-dir", ckpt,
                                  "--checkpoint-every", "5"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), shape.args.begin(), shape.args.end());
    argv.insert(argv.end(), more.begin(), more.end());
    return cohort::testing::run_process(argv, 240s, {{"OMP_NUM_THREADS", "1"}});
  };
  auto first = job({"--max-steps", "15"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  ASSERT_TRUE(fs::exists(ckpt + "/step-000000015")) << describe(first);
  auto second = job({"--save-final", resumed});
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resuming from " + ckpt + "/step-000000015 (step 15)"), std::string::npos)
      << describe(second);
  EXPECT_NE(second.out.find("\"committed_here\":15"), std::string::npos) << describe(second);
  EXPECT_LT(max_difference(alone, resumed), kAcrossWorldSizes);
}

TEST(Trainer, FaultTolerantRunResumesFromDiskWhenNoReplicaIsLeft) {
  TempDir dir("cohort-trainer");
  resume_from_disk(dir, {});
}

// The same with ZeRO-1 inside replicas of two ranks: the quorum's first replica
// writes each checkpoint (its optimizer gathered over its two ranks), and every
// replica's ranks load it back, each keeping its shard.
TEST(Trainer, FaultTolerantZero1RunResumesFromDiskWhenNoReplicaIsLeft) {
  TempDir dir("cohort-trainer");
  resume_from_disk(dir, {4, 0, {"--zero", "1", "--shards-per-replica", "2"}});
}

TEST(Trainer, FaultToleranceFlagsThatCannotWorkExitTwo) {
  for (const auto& extra : std::vector<std::vector<std::string>>{{"--zero", "1"},
                                                                  {"--zero", "3", "--shards-per-replica", "2"},
                                                                  {"--pipeline-stages", "2"},
                                                                  {"--data-parallel-replicas", "2"},
                                                                  {"--amp", "fp16", "--device", "cuda"},
                                                                  {"--comm-hook", "powersgd"}}) {
    std::vector<std::string> argv{COHORT_TRAINER_PATH, "--fault-tolerance"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto r = cohort::testing::run_process(argv, 30s);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find("--fault-tolerance with " + extra[0]), std::string::npos) << describe(r);
  }
  // --straggler-every names the way through too (issue 46, item 5).
  auto straggler = cohort::testing::run_process({COHORT_TRAINER_PATH, "--fault-tolerance", "--straggler-every", "5"}, 30s);
  EXPECT_EQ(straggler.exit_code, 2) << describe(straggler);
  EXPECT_NE(straggler.err.find("drop --straggler-every here, and find slow ranks in a run without --fault-tolerance"),
            std::string::npos)
      << describe(straggler);
  // --zero 1 alone names the way through: replicas of several ranks.
  auto zero = cohort::testing::run_process({COHORT_TRAINER_PATH, "--fault-tolerance", "--zero", "1"}, 30s);
  EXPECT_NE(zero.err.find("add --shards-per-replica 2"), std::string::npos) << describe(zero);
  // --shards-per-replica cuts fault-tolerant replicas for ZeRO, and means nothing without both.
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {COHORT_TRAINER_PATH, "--shards-per-replica", "2", "--zero", "1"},
           {COHORT_TRAINER_PATH, "--shards-per-replica", "2", "--fault-tolerance"}}) {
    auto r = cohort::testing::run_process(argv, 30s);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.err.find("it needs --fault-tolerance and --zero 1 or 2"), std::string::npos) << describe(r);
  }
}

// Note [Refusals reach the launcher] (examples/fashion_mnist/main.cpp): under
// `cohort run --fault-tolerance in-process`, a flag the trainer refuses is recorded as
// a ConfigError, so no worker is replaced, no restart is spent, and the job exits 2
// (issue 46, item 5: every restart was spent, and the job exited 1).
TEST(Trainer, AFlagRefusedUnderFaultToleranceSpendsNoRestartAndExitsTwo) {
  auto r = cohort::testing::run_process({COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--fault-tolerance",
                                         "in-process", "--max-restarts", "3", "--stop-timeout", "3",
                                         COHORT_TRAINER_PATH, "--fault-tolerance", "--zero", "3"},
                                        120s, {{"OMP_NUM_THREADS", "1"}});
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--fault-tolerance with --zero 3"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("not replaced: it stopped on a configuration error"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("0 of --max-restarts 3 single-worker restart(s) used"), std::string::npos) << describe(r);
  EXPECT_EQ(r.err.find("(incarnation 1"), std::string::npos) << describe(r);
}

// Note [Settings every rank shares] (examples/fashion_mnist/settings.cpp): a rank
// started with another --seed is named, with both values and the ranks, by the
// agreement at start; the job ends with 2 and is not restarted (issue 46, item 10:
// it trained on silently to weights that neither seed gives, and flags that shape
// the collectives hung until the timeout).
TEST(Trainer, ARankStartedWithAnotherFlagIsNamedAndTheJobExitsTwo) {
  const std::string per_rank = "if [ \"$RANK\" = 1 ]; then s=5; else s=11; fi; exec \"$0\" \"$@\" --seed $s";
  const std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--max-restarts", "2",
                                      "--stop-timeout", "3", "/bin/sh", "-c", per_rank, COHORT_TRAINER_PATH,
                                      "--epochs", "1", "--limit-train-batches", "8", "--optimizer", "sgd"};
  auto r = cohort::testing::run_process(argv, 240s, {{"COHORT_TIMEOUT", "60"}, {"OMP_NUM_THREADS", "1"}});
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--seed differs across ranks: 11 on rank 0; 5 on rank 1."), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("Pass the same flags to every rank"), std::string::npos) << describe(r);
  EXPECT_EQ(r.err.find("restarting every worker"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("not restarting: worker"), std::string::npos) << describe(r);
}

}  // namespace
