// The GPT trainer (examples/gpt) as a user runs it, through `cohort run` with two
// processes: it trains, its validation loss falls, it samples text and ends with the
// JSON line; impossible flags stop it with a message that says why.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <sstream>

#include "support/subprocess.h"
#include "support/temp_dir.h"

using namespace std::chrono_literals;

namespace {

// A model and run small enough for a few seconds on two cores.
const std::vector<std::string> kTiny = {"--layers", "1",    "--embed-dim", "32",  "--heads",        "2",
                                        "--context", "32",  "--batch-size", "8",  "--steps",        "40",
                                        "--eval-every", "20", "--eval-batches", "2", "--lr",        "1e-2",
                                        "--samples", "1",   "--sample-tokens", "8", "--vocab-size", "512"};

cohort::testing::ProcessResult run_gpt(const std::string& cache, std::vector<std::string> args) {
  std::vector<std::string> argv{COHORT_CLI_PATH, "run", "--nproc-per-node", "2", "--stop-timeout", "3",
                                COHORT_GPT_PATH, "--cache-dir", cache};
  argv.insert(argv.end(), args.begin(), args.end());
  return cohort::testing::run_process(argv, 120s, {{"COHORT_TIMEOUT", "60"}, {"OMP_NUM_THREADS", "1"}});
}

std::string describe(const cohort::testing::ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

// Rank 0's last JSON line.
nlohmann::json summary(const std::string& out) {
  const std::string tag = "[rank0]: {";
  const auto at = out.rfind(tag);
  if (at == std::string::npos) return nullptr;
  const auto end = out.find('\n', at);
  return nlohmann::json::parse(out.substr(at + tag.size() - 1, end - at - tag.size() + 1), nullptr, false);
}

void expect_trained(const cohort::testing::ProcessResult& r) {
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto j = summary(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_LT(j.at("val_loss").get<double>(), j.at("first_val_loss").get<double>() - 0.3) << r.out;
  EXPECT_EQ(j.at("steps").get<int>(), 40);
  EXPECT_GT(j.at("tokens_per_second").get<double>(), 0);
  EXPECT_NE(r.out.find("[rank0]: sample 1: "), std::string::npos) << r.out;
}

TEST(GptTrainer, TensorParallelTrainsAndSamples) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  const auto r = run_gpt(cache.path, kTiny);
  expect_trained(r);
  const auto j = summary(r.out);
  EXPECT_EQ(j.at("tp").get<int>(), 2);
  EXPECT_EQ(j.at("dp").get<int>(), 1);
  EXPECT_TRUE(j.at("mfu").is_number()) << r.out;
}

// --timing-warmup leaves its steps out of the timing (Note [Timing after a warm-up])
// and --peak-tflops is the peak per process the MFU divides by, over the whole world.
TEST(GptTrainer, MfuIsOverTheTimedStepsAndTheGivenPeak) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  args.insert(args.end(), {"--timing-warmup", "10", "--peak-tflops", "0.001"});
  const auto r = run_gpt(cache.path, args);
  expect_trained(r);
  const auto j = summary(r.out);
  EXPECT_EQ(j.at("timed_steps").get<int>(), 30);
  EXPECT_GT(j.at("timed_tokens_per_second").get<double>(), 0);
  EXPECT_EQ(j.at("peak_source").get<std::string>(), "--peak-tflops");
  EXPECT_DOUBLE_EQ(j.at("peak_tflops").get<double>(), 0.002);  // 2 processes
  EXPECT_NEAR(j.at("mfu").get<double>(), j.at("gflops").get<double>() / 2.0, 1e-12) << r.out;
}

TEST(GptTrainer, SequenceParallelWithBf16AndRecompute) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  args.insert(args.end(), {"--sequence-parallel", "--amp", "bf16", "--activation-checkpointing", "--dropout", "0.1"});
  expect_trained(run_gpt(cache.path, args));
}

TEST(GptTrainer, ZeroThreeOverTwoReplicas) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  args.insert(args.end(), {"--tp", "1", "--zero", "3"});
  const auto r = run_gpt(cache.path, args);
  expect_trained(r);
  EXPECT_EQ(summary(r.out).at("dp").get<int>(), 2);
}

TEST(GptTrainer, PipelineOfTwoStages) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  // Two stages need two blocks; four micro-batches of the batch's 8 rows under 1F1B.
  args.at(1) = "2";
  args.insert(args.end(), {"--tp", "1", "--pp", "2", "--microbatches", "4"});
  const auto r = run_gpt(cache.path, args);
  expect_trained(r);
  const auto j = summary(r.out);
  EXPECT_EQ(j.at("pp").get<int>(), 2);
  EXPECT_EQ(j.at("dp").get<int>(), 1);
  EXPECT_EQ(j.at("microbatches").get<int>(), 4);
  EXPECT_EQ(j.at("comm_hook").get<std::string>(), "pipeline");
}

// Rank 0's `step N loss X` lines (--log-losses), by step.
std::map<int, double> losses(const std::string& out) {
  std::map<int, double> by_step;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    int step = 0;
    double loss = 0;
    if (std::sscanf(line.c_str(), "[rank0]: step %d loss %lf", &step, &loss) == 2) by_step[step] = loss;
  }
  return by_step;
}

// Stopped after a checkpoint at step 20 of 30 as TP 2, resumed by the same two
// processes as DP 2 × TP 1: steps 21..30 and the final validation loss are the
// uninterrupted run's (to fp32 rounding: the TP split sums in another order).
// `flags` are added to every run (--checkpoint-async: a thread writes them).
void resumes_at_another_tensor_parallel_size(const std::vector<std::string>& flags) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  cohort::testing::TempDir checkpoints("cohort-gpt-ckpt");
  auto args = kTiny;
  args.at(11) = "30";  // --steps
  args.push_back("--log-losses");
  const auto whole = run_gpt(cache.path, args);
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);

  args.insert(args.end(), {"--checkpoint-dir", checkpoints.path, "--checkpoint-every", "10"});
  args.insert(args.end(), flags.begin(), flags.end());
  auto first = args;
  first.insert(first.end(), {"--stop-after", "20"});
  const auto stopped = run_gpt(cache.path, first);
  ASSERT_EQ(stopped.exit_code, 0) << describe(stopped);
  EXPECT_NE(stopped.out.find("[rank0]: gpt: stopped after step 20 (--stop-after)"), std::string::npos) << stopped.out;
  EXPECT_FALSE(losses(stopped.out).count(21)) << stopped.out;

  auto second = args;
  second.insert(second.end(), {"--tp", "1"});
  const auto resumed = run_gpt(cache.path, second);
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.out.find("[rank0]: gpt: resumed from step 20"), std::string::npos) << resumed.out;

  const auto expected = losses(whole.out), got = losses(resumed.out);
  EXPECT_FALSE(got.count(20)) << resumed.out;
  for (int step = 21; step <= 30; ++step) {
    ASSERT_TRUE(expected.count(step) && got.count(step)) << step << "\n" << whole.out << "\n" << resumed.out;
    EXPECT_NEAR(got.at(step), expected.at(step), 1e-4) << "step " << step;
  }
  const auto a = summary(whole.out), b = summary(resumed.out);
  ASSERT_TRUE(a.is_object() && b.is_object()) << whole.out << resumed.out;
  EXPECT_NEAR(b.at("val_loss").get<double>(), a.at("val_loss").get<double>(), 1e-4);
  EXPECT_EQ(b.at("resumed_from_step").get<int>(), 20);
  EXPECT_EQ(a.at("resumed_from_step").get<int>(), 0);
  EXPECT_EQ(b.at("tp").get<int>(), 1);
  EXPECT_EQ(b.at("dp").get<int>(), 2);
  // The JSON line says what the checkpoints cost: the resumed run saved step 30 alone.
  ASSERT_TRUE(b.at("checkpoints").is_object()) << resumed.out;
  EXPECT_EQ(b.at("checkpoints").at("saves").get<int>(), 1) << resumed.out;
  EXPECT_GE(b.at("checkpoints").at("blocked_ms_max").get<double>(), b.at("checkpoints").at("blocked_ms_median").get<double>());
  // The writer thread's CPU time: spent exactly when there is a writer thread.
  const bool async = std::find(flags.begin(), flags.end(), "--checkpoint-async") != flags.end();
  EXPECT_EQ(b.at("checkpoints").at("writer_cpu_s").get<double>() > 0, async) << resumed.out;
}

TEST(GptTrainer, ResumesAtAnotherTensorParallelSize) { resumes_at_another_tensor_parallel_size({}); }

// --checkpoint-async: the split parameters are gathered whole, copied to host memory
// and written by a thread (docs/checkpoints.md#asynchronous-checkpoints).
TEST(GptTrainer, AsyncCheckpointsResumeAtAnotherTensorParallelSize) {
  resumes_at_another_tensor_parallel_size({"--checkpoint-async"});
}

// --checkpoint-format dcp: PyTorch's format holds the split parameters whole too.
TEST(GptTrainer, CheckpointsInPyTorchsFormatResumeAtAnotherTensorParallelSize) {
  resumes_at_another_tensor_parallel_size({"--checkpoint-format", "dcp"});
}

// Note [The stage's mode is the model's] (examples/gpt/pipeline.cpp): under --pp the
// first stage's embedding dropout is the Gpt's, which the stage's eval() did not
// reach. Evaluation then ran with dropout on (a step-0 validation loss unlike one
// process's) and drew from the generator, so every later training step differed
// from a run that did not evaluate.
TEST(GptTrainer, PipelineEvaluatesWithDropoutOffAndChangesNoStep) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  args.at(1) = "2";   // --layers: a block per stage
  args.at(11) = "6";  // --steps
  args.at(15) = "1";  // --eval-batches
  args.at(19) = "0";  // --samples
  args.insert(args.end(), {"--tp", "1", "--dropout", "0.5", "--log-losses"});
  const auto run = [&](const std::string& pp, const std::string& eval_every) {
    auto a = args;
    a.at(13) = eval_every;
    a.insert(a.end(), {"--pp", pp});
    auto r = run_gpt(cache.path, a);
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return r;
  };
  const auto one = run("1", "0");  // two replicas, no pipeline
  const auto evaluating = run("2", "2");
  const auto quiet = run("2", "0");
  const auto a = summary(one.out), b = summary(evaluating.out), c = summary(quiet.out);
  ASSERT_TRUE(a.is_object() && b.is_object() && c.is_object()) << one.out << evaluating.out << quiet.out;
  // Step 0: the same weights, evaluated without dropout, at --pp 1 and 2.
  EXPECT_NEAR(b.at("first_val_loss").get<double>(), a.at("first_val_loss").get<double>(), 1e-5);
  EXPECT_NEAR(c.at("first_val_loss").get<double>(), a.at("first_val_loss").get<double>(), 1e-5);
  // Evaluating at steps 2 and 4 changes no training step.
  const auto with = losses(evaluating.out), without = losses(quiet.out);
  ASSERT_EQ(with.size(), 6u) << evaluating.out;
  for (const auto& [step, loss] : without) EXPECT_EQ(with.at(step), loss) << "step " << step;
}

// Rank 0's ` grad_norm Y` (--log-losses with --clip-grad-norm), by step.
std::map<int, double> grad_norms(const std::string& out) {
  std::map<int, double> by_step;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    int step = 0;
    double loss = 0, norm = 0;
    if (std::sscanf(line.c_str(), "[rank0]: step %d loss %lf grad_norm %lf", &step, &loss, &norm) == 3)
      by_step[step] = norm;
  }
  return by_step;
}

// --clip-grad-norm (cohort::optim::clip_grad_norm_): the whole model's gradient norm
// is the same however the two processes split the model: TP 2 (its LayerNorms
// counted once, not twice), two replicas (not summed), two pipeline stages (the tied
// output copy not counted again) and ZeRO-3 shards (summed). The clipped runs then
// train alike, and unlike the unclipped one.
TEST(GptTrainer, ClippingSeesTheWholeModelsNormUnderEverySplit) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto args = kTiny;
  args.at(1) = "2";   // --layers: a block per stage
  args.at(11) = "5";  // --steps
  args.at(13) = "0";  // --eval-every
  args.at(15) = "1";  // --eval-batches
  args.at(19) = "0";  // --samples
  args.insert(args.end(), {"--dropout", "0", "--log-losses"});
  const auto run = [&](std::vector<std::string> extra, bool clip = true) {
    auto a = args;
    if (clip) a.insert(a.end(), {"--clip-grad-norm", "0.05"});
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_gpt(cache.path, a);
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return r;
  };
  const auto tp = run({"--tp", "2"});
  const auto dp = run({"--tp", "1"});
  const auto pp = run({"--tp", "1", "--pp", "2"});
  const auto zero3 = run({"--tp", "1", "--zero", "3"});
  const auto unclipped = run({"--tp", "1"}, false);
  const auto reference = grad_norms(dp.out);
  ASSERT_EQ(reference.size(), 5u) << dp.out;
  // The limit is below every step's norm here, so each step was clipped.
  for (const auto& [step, norm] : reference) EXPECT_GT(norm, 0.05) << "step " << step;
  for (const auto* r : {&tp, &pp, &zero3}) {
    const auto got = grad_norms(r->out);
    ASSERT_EQ(got.size(), 5u) << r->out;
    for (const auto& [step, norm] : reference)
      EXPECT_NEAR(got.at(step), norm, 1e-4 * norm) << "step " << step << "\n" << r->out;
    const auto l = losses(r->out), want = losses(dp.out);
    for (const auto& [step, loss] : want) EXPECT_NEAR(l.at(step), loss, 1e-4) << "step " << step;
  }
  EXPECT_TRUE(grad_norms(unclipped.out).empty()) << unclipped.out;
  const auto free = losses(unclipped.out), held = losses(dp.out);
  ASSERT_EQ(free.size(), 5u) << unclipped.out;
  EXPECT_EQ(free.at(1), held.at(1));  // the same first forward
  EXPECT_GT(std::abs(free.at(5) - held.at(5)), 1e-4) << "clipping changed no step";
}

TEST(GptTrainer, ImpossibleFlagsSayWhy) {
  cohort::testing::TempDir cache("cohort-gpt-test");
  auto sharded = run_gpt(cache.path, {"--tp", "1", "--pp", "2", "--zero", "3"});
  EXPECT_NE(sharded.exit_code, 0) << describe(sharded);
  EXPECT_NE((sharded.out + sharded.err).find("--pp 2 --tp 1 --zero 3 cannot run together"), std::string::npos)
      << describe(sharded);
  EXPECT_NE((sharded.out + sharded.err).find("ZeRO-3 cannot shard a pipeline's stages"), std::string::npos)
      << describe(sharded);
  // ZeRO-2 composes with sequence parallelism (docs/tensor_parallel.md); ZeRO-3 does not.
  auto sp = run_gpt(cache.path, {"--sequence-parallel", "--zero", "3"});
  EXPECT_NE(sp.exit_code, 0) << describe(sp);
  EXPECT_NE((sp.out + sp.err).find("use --zero 0, 1 or 2 with --sequence-parallel"), std::string::npos)
      << describe(sp);
  auto heads = run_gpt(cache.path, {"--heads", "3"});
  EXPECT_NE(heads.exit_code, 0) << describe(heads);
  EXPECT_NE((heads.out + heads.err).find("make --heads a multiple of --tp"), std::string::npos) << describe(heads);
  cohort::testing::TempDir checkpoints("cohort-gpt-ckpt");
  auto zero = run_gpt(cache.path, {"--tp", "1", "--zero", "1", "--checkpoint-dir", checkpoints.path});
  EXPECT_NE(zero.exit_code, 0) << describe(zero);
  EXPECT_NE((zero.out + zero.err).find("--checkpoint-dir with --zero 1"), std::string::npos) << describe(zero);
  auto clip = run_gpt(cache.path, {"--tp", "1", "--zero", "2", "--clip-grad-norm", "1"});
  EXPECT_NE(clip.exit_code, 0) << describe(clip);
  EXPECT_NE((clip.out + clip.err).find("--clip-grad-norm with --zero 2"), std::string::npos) << describe(clip);
}

}  // namespace
