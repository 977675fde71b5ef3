#include "trainer.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>

#include "batches.h"
#include "checkpoints.h"
#include "clipping.h"
#include "cohort/comm/config_agreement.h"
#include "cohort/comm/device_mesh.h"
#include "cohort/comm/world.h"
#include "cohort/data/to_device.h"
#include "cohort/errors.h"
#include "cohort/optim/clip_grad_norm.h"
#include "cohort/system/cuda.h"
#include "cohort/tensor_parallel/block.h"
#include "cohort/tensor_parallel/composition.h"
#include "cohort/trace/timeline.h"
#include "cohort/trace/world_timeline.h"
#include "corpus.h"
#include "evaluate.h"
#include "mixed_precision.h"
#include "optimizer.h"
#include "peer.h"
#include "performance.h"
#include "preset.h"
#include "sample.h"
#include "strategy.h"
#include "tokenizer.h"

namespace gpt {
namespace {

using Clock = std::chrono::steady_clock;
using cohort::comm::MeshDim;

c10::Device choose_device(const GptTrainerOptions& o, const cohort::comm::World& world) {
  if (o.device == "cpu" || (o.device == "auto" && !torch::cuda::is_available())) return torch::kCPU;
  if (!torch::cuda::is_available())
    throw cohort::ConfigError("--device cuda: no CUDA device is usable: " + cohort::system::detect_cuda().why_no_gpu() +
                              "; or use --device cpu (or auto)");
  if (world.device().is_cuda()) return world.device();
  const auto count = static_cast<int>(torch::cuda::device_count());
  return c10::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % count));
}

double peak_rss_mb() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// What the mesh and the flags combine to, refused before anything is built when
// cohort cannot run it (or has not proven it equal to one process), naming the flags.
void check_flags(const GptTrainerOptions& o, cohort::comm::DeviceMesh& mesh) {
  const int dp = mesh.size(MeshDim::kData), pp = mesh.size(MeshDim::kPipeline), tp = mesh.size(MeshDim::kTensor);
  try {
    cohort::tensor_parallel::check_composition(cohort::tensor_parallel::Composition()
                                                   .data(dp)
                                                   .pipeline(pp)
                                                   .tensor(tp)
                                                   .zero(o.zero)
                                                   .sequence_parallel(o.sequence_parallel));
  } catch (const cohort::ConfigError& e) {
    throw cohort::ConfigError(fmt::format("gpt: --dp {} --pp {} --tp {} --zero {}{} cannot run together: {}", dp, pp,
                                          tp, o.zero, o.sequence_parallel ? " --sequence-parallel" : "", e.what()));
  }
  // Pipeline::step cuts each replica's rows into the micro-batches.
  const std::int64_t rows = o.batch_size / dp;
  if (pp > 1 && rows < o.microbatches)
    throw cohort::ConfigError(fmt::format("gpt: --microbatches {} is more than the {} rows each of the {} data-parallel "
                                          "replicas gets of --batch-size {}; use --microbatches {} or fewer, or a "
                                          "larger --batch-size",
                                          o.microbatches, rows, dp, o.batch_size, rows));
}

std::unique_ptr<Strategy> parallelize(const GptTrainerOptions& o, Gpt model, const cohort::comm::World& world,
                                      cohort::comm::DeviceMesh& mesh, c10::Device device) {
  // A pipeline recomputes per stage (PipelineOptions::recompute), not per block.
  if (mesh.size(MeshDim::kPipeline) > 1) return make_pipeline_parallel(std::move(model), world, mesh, o, device);
  if (o.activation_checkpointing) model->use_activation_checkpointing();
  if (o.zero == 3) return make_fully_sharded(std::move(model), mesh);
  if (o.zero == 2) return make_sharded_gradients(std::move(model), mesh);
  return make_data_parallel(std::move(model), mesh);
}

// Note [Settings every rank shares] (examples/fashion_mnist/settings.cpp), for the
// GPT: the mesh, the model, the run, the sampling at the end (collective under TP),
// and the checkpoints must be alike on every rank; whether --save-initial is given
// too (gathering the whole state is collective), not its path. Left out on purpose:
// --fortunes-dir and --cache-dir (each node reads and tokenizes its own copy, where
// it likes), --dump-data, --log-losses and --log-interval (rank 0's alone).
std::vector<cohort::comm::Setting> shared_settings(const GptTrainerOptions& o) {
  auto text = [](const auto& v) { return fmt::format("{}", v); };
  auto flag = [](bool v) { return std::string(v ? "on" : "off"); };
  return {
      {"--dp", text(o.dp)},
      {"--tp", text(o.tp)},
      {"--pp", text(o.pp)},
      {"--microbatches", text(o.microbatches)},
      {"--sequence-parallel", flag(o.sequence_parallel)},
      {"--zero", text(o.zero)},
      {"--amp", o.amp},
      {"--clip-grad-norm", text(o.clip_grad_norm)},
      {"--optimizer-kernel", o.optimizer_kernel},
      {"--activation-checkpointing", flag(o.activation_checkpointing)},
      {"--layers", text(o.layers)},
      {"--embed-dim", text(o.embed_dim)},
      {"--heads", text(o.heads)},
      {"--context", text(o.context)},
      {"--dropout", text(o.dropout)},
      {"--vocab-size", text(o.vocab_size)},
      {"--vocab-multiple", text(o.vocab_multiple)},
      {"--steps", text(o.steps)},
      {"--batch-size", text(o.batch_size)},
      {"--lr", text(o.lr)},
      {"--warmup-steps", text(o.warmup_steps)},
      {"--weight-decay", text(o.weight_decay)},
      {"--seed", text(o.seed)},
      {"--eval-every", text(o.eval_every)},
      {"--eval-batches", text(o.eval_batches)},
      {"--device", o.device},
      {"--samples", text(o.samples)},
      {"--sample-tokens", text(o.sample_tokens)},
      {"--temperature", text(o.temperature)},
      {"--top-k", text(o.top_k)},
      {"--save-initial (given)", flag(!o.save_initial.empty())},
      {"--checkpoint-dir", o.checkpoint_dir},
      {"--checkpoint-every", text(o.checkpoint_every)},
      {"--checkpoint-async", flag(o.checkpoint_async)},
      {"--checkpoint-when-busy", o.checkpoint_when_busy},
      {"--checkpoint-format", o.checkpoint_format},
      {"--stop-after", text(o.stop_after)},
  };
}

}  // namespace

int train(const GptTrainerOptions& o) {
  const auto started = Clock::now();
  // Note [--device cpu on a GPU machine] (examples/fashion_mnist/trainer.cpp).
  // `cohort run --timeline DIR` draws each step's collectives (docs/timeline.md);
  // benchmarks/compare_gpt.sh counts the TP all-reduce bytes from it.
  auto init = cohort::trace::traced();
  if (o.device == "cpu") init.backend("gloo");
  auto world = cohort::comm::World::init(init);
  // Note [Settings every rank shares]: before the mesh, whose groups the flags shape.
  cohort::comm::agree_on_settings(world, shared_settings(o));
  auto timeline = cohort::trace::timeline_of(world);
  const bool lead = world.rank() == 0;
  const c10::Device device = choose_device(o, world);
  cohort::comm::DeviceMesh mesh(world, cohort::comm::MeshShape().data(o.dp).pipeline(o.pp).tensor(o.tp));
  auto& tp = mesh.group(MeshDim::kTensor);
  auto& data = mesh.group(MeshDim::kData);
  const int dp = mesh.size(MeshDim::kData);
  try {
    check_flags(o, mesh);
    if (o.batch_size % dp != 0)
      throw cohort::ConfigError(fmt::format("gpt: --batch-size {} cannot be split evenly over the {} data-parallel "
                                            "replicas ({}); make it a multiple of {}",
                                            o.batch_size, dp, mesh.describe(), dp));
  } catch (const cohort::ConfigError&) {
    // Every rank refuses alike; the barrier keeps one from tearing its groups down
    // while another still connects to them, which would end that one with Gloo's
    // "connection closed" instead of this message.
    world.group().barrier();
    throw;
  }
  std::optional<Checkpoints> checkpoints;  // refuses what it cannot save before anything is built
  if (!o.checkpoint_dir.empty()) checkpoints.emplace(o, world);

  // The corpus and its tokens (Note [One builder per node]).
  const auto corpus = split_corpus(read_fortunes(o.fortunes_dir));
  TokenCacheOptions cache;
  cache.cache_dir = o.cache_dir;
  cache.vocab_size = o.vocab_size;
  cache.build = world.local_rank() == 0;
  cache.rank = world.rank();
  cache.builder_rank = world.rank() - world.local_rank();
  const auto tokens = load_token_streams(corpus, cache);
  // The vocabulary is split over the TP group: pad it to a multiple of its size and
  // of --vocab-multiple (Note [The padding is never a token] in preset.cpp).
  const auto padded_vocab = static_cast<int>(padded_vocab_size(tokens.vocab_size, o.tp, o.vocab_multiple));
  if (lead) {
    std::cout << fmt::format("gpt: {}, {} fortunes ({} training tokens, {} validation), vocabulary {} (padded to {}), "
                             "cache {}",
                             mesh.describe(), corpus.train.size() + corpus.validation.size(), tokens.train.size(),
                             tokens.validation.size(), tokens.vocab_size, padded_vocab, tokens.folder)
              << std::endl;
  }
  if (lead && !o.dump_data.empty()) dump_data(tokens, padded_vocab, o.dump_data);

  // Every rank draws the same whole model from the seed and keeps its TP slice
  // (Note [Whole, then sliced]); the generators stay in step, which TP's dropout needs.
  torch::manual_seed(o.seed);
  Gpt model(tp, GptOptions(padded_vocab)
                    .unpadded_vocab_size(tokens.vocab_size)  // Note [The padding draws nothing]
                    .context(o.context)
                    .embed_dim(o.embed_dim)
                    .num_heads(o.heads)
                    .layers(o.layers)
                    .dropout(o.dropout)
                    .sequence_parallel(o.sequence_parallel));
  model->to(device);
  if (!o.save_initial.empty()) save_whole_state(*model, tp, lead, o.save_initial);
  const double params = static_cast<double>(model->whole_parameter_count());
  auto strategy = parallelize(o, model, world, mesh, device);
  GptPipeline* const pipe = strategy->pipeline();
  auto optimizer = make_optimizer(o, *strategy, mesh);
  autocast(o.amp, device);  // refuses what autocast cannot do here, at start rather than mid-step
  const Peak peak = find_peak(world, device, o.peak_tflops);
  // Weights, AdamW's state and the generators; the step gives the batches and the
  // learning rate (Note [The batch rule]).
  std::int64_t start = 0;
  if (checkpoints) {
    if (auto step = checkpoints->resume(*strategy, *optimizer, device)) {
      start = *step;
      if (lead) std::cout << fmt::format("gpt: resumed from step {} ({})", start, o.checkpoint_dir) << std::endl;
    }
  }

  const auto clip = clipping_parts(o, *strategy, mesh);
  const std::int64_t tokens_per_step = o.batch_size * o.context;
  double train_s = 0, last_loss = 0;
  // Note [No host read per step] (examples/fashion_mnist/trainer.cpp): the last
  // step's loss stays on the device until a line or the final report shows it.
  at::Tensor last_mean;
  auto read_loss = [&] {
    if (last_mean.defined()) last_loss = last_mean.item<double>();
    last_mean = at::Tensor();
  };
  Evaluation eval;
  std::vector<std::pair<std::int64_t, double>> curve;  // (step, validation loss)
  auto run_eval = [&](std::int64_t step) {
    read_loss();
    eval = evaluate(*strategy, tokens.validation, o, mesh, device);
    curve.emplace_back(step, eval.loss);
    if (lead) {
      std::cout << fmt::format("step {:>5}/{}  train loss {:.4f}  val loss {:.4f}  perplexity {:.1f}  {:.0f} tokens/s",
                               step, o.steps, last_loss, eval.loss, eval.perplexity(),
                               step > start ? static_cast<double>((step - start) * tokens_per_step) / train_s : 0.0)
                << std::endl;
    }
  };
  run_eval(start);
  // Note [Timing after a warm-up]
  // The first steps on a GPU pay for cuBLAS's and the allocator's setup and the
  // kernels' first launches, and the host runs ahead of the device (no host read per
  // step), so host time per step says little there. With --timing-warmup N the
  // device is synchronised after step N and after the last step, and the wall time
  // between is what tokens/s and MFU are measured over, as benchmarks/gpt_peer.py
  // does on its side. Whatever else the loop does in that window (an evaluation
  // with --eval-every, a checkpoint) counts too: benchmarks leave both off.
  const std::int64_t timed_from = std::max(start, o.timing_warmup);
  auto synchronized_now = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    return Clock::now();
  };
  Clock::time_point timed_begin, timed_end;
  if (o.timing_warmup > 0 && timed_from == start) timed_begin = synchronized_now();
  auto last_line = Clock::now();
  std::optional<std::string> reported_failure;  // --checkpoint-async: a failed write, logged once
  for (std::int64_t s = start; s < o.steps; ++s) {
    cohort::trace::step(timeline.get(), s + 1);
    const auto t0 = Clock::now();
    for (auto& group : optimizer->param_groups()) group.options().set_lr(learning_rate(o, s));
    optimizer->zero_grad();
    auto batch = training_batch(tokens.train, s, o.batch_size, o.context, data.rank(), dp);
    at::Tensor mean;  // the batch's loss: the same on every TP rank (and pipeline stage)
    if (pipe) {
      // Forward and backward of every micro-batch; the tied copies' and (under
      // sequence parallelism) the replicated parameters' gradients summed.
      const auto result =
          pipe->step(cohort::data::to_device(batch.inputs, device), cohort::data::to_device(batch.targets, device));
      mean = torch::tensor({result.loss}, torch::dtype(torch::kFloat64).device(device));
    } else {
      at::Tensor logits;
      {
        auto guard = autocast(o.amp, device);
        logits = strategy->forward(cohort::data::to_device(batch.inputs, device));
      }
      auto loss = strategy->gpt().loss(logits.to(torch::kFloat), cohort::data::to_device(batch.targets, device));
      loss.backward();
      // Under sequence parallelism each TP rank's gradients of the replicated
      // parameters cover only its shard of the sequence (docs/tensor_parallel.md).
      if (o.sequence_parallel) cohort::tensor_parallel::sum_replicated_gradients(strategy->model(), tp);
      mean = loss.detach().to(torch::kFloat64).reshape({1});
    }
    at::Tensor grad_norm;  // before clipping, the whole model's
    if (!clip.empty())
      grad_norm = cohort::optim::clip_grad_norm_(clip, cohort::optim::ClipGradNormOptions(o.clip_grad_norm));
    optimizer->step();
    // Averaged over the replicas.
    if (dp > 1) data.all_reduce(mean, cohort::comm::ReduceOp::kAvg);
    last_mean = mean;
    train_s += std::chrono::duration<double>(Clock::now() - t0).count();
    const std::int64_t step = s + 1;
    if (o.timing_warmup > 0 && step == timed_from) timed_begin = synchronized_now();
    if (o.timing_warmup > 0 && step == o.steps) timed_end = synchronized_now();
    if (lead && o.log_losses) read_loss();
    if (lead && o.log_losses) {
      std::cout << fmt::format("step {} loss {:.6f}", step, last_loss);
      if (grad_norm.defined()) std::cout << fmt::format(" grad_norm {:.6f}", grad_norm.item<double>());
      std::cout << std::endl;
    }
    if (lead && !o.log_losses && std::chrono::duration<double>(Clock::now() - last_line).count() >= o.log_interval_s) {
      read_loss();
      std::cout << fmt::format("step {:>5}/{}  train loss {:.4f}  {:.0f} tokens/s", step, o.steps, last_loss,
                               static_cast<double>((step - start) * tokens_per_step) / train_s)
                << std::endl;
      last_line = Clock::now();
    }
    if ((o.eval_every > 0 && step % o.eval_every == 0) || step == o.steps) {
      if (curve.back().first != step) run_eval(step);
      last_line = Clock::now();
    }
    if (checkpoints && checkpoints->due(step)) checkpoints->save(*strategy, *optimizer, step, device);
    if (checkpoints && lead) {
      if (auto failure = checkpoints->write_failure(); failure && failure != reported_failure) {
        std::cerr << "gpt: warning: " << *failure << "; the next checkpoint raises it" << std::endl;
        reported_failure = failure;
      }
    }
    if (step == o.stop_after) {
      checkpoints->finish(device);
      if (lead) std::cout << fmt::format("gpt: stopped after step {} (--stop-after)", step) << std::endl;
      return 0;
    }
  }

  if (checkpoints) checkpoints->finish(device);  // the last asynchronous write, or its failure on every rank
  Tokenizer tokenizer(tokens.folder);
  const auto texts = sample_texts(*strategy, tokenizer, tokens.vocab_size, tokens.eos_id, o, world, mesh, device);
  auto rss = torch::tensor({peak_rss_mb()}, torch::dtype(torch::kFloat64).device(device));
  world.group().all_reduce(rss, cohort::comm::ReduceOp::kMax);
  read_loss();
  if (lead) {
    for (std::size_t i = 0; i < texts.size(); ++i) std::cout << fmt::format("sample {}: {}", i + 1, texts[i]) << std::endl;
    const std::int64_t trained = (o.steps - std::min(start, o.steps)) * tokens_per_step;  // by this run
    const double tokens_per_second = static_cast<double>(trained) / std::max(train_s, 1e-9);
    // Note [Timing after a warm-up]: MFU over the timed steps when there is a warm-up.
    const std::int64_t timed_steps = o.timing_warmup > 0 ? o.steps - timed_from : 0;
    const double timed_s = timed_steps > 0 ? std::chrono::duration<double>(timed_end - timed_begin).count() : 0;
    const double timed_tokens_per_second =
        timed_steps > 0 ? static_cast<double>(timed_steps * tokens_per_step) / std::max(timed_s, 1e-9) : 0;
    const auto& net = strategy->gpt();
    const double flops = timed_steps > 0
                             ? net.training_flops(timed_steps * tokens_per_step, o.context) / std::max(timed_s, 1e-9)
                             : net.training_flops(trained, o.context) / std::max(train_s, 1e-9);
    nlohmann::json curve_json = nlohmann::json::array();
    for (const auto& [step, loss] : curve) curve_json.push_back({{"step", step}, {"val_loss", loss}});
    nlohmann::json summary = {
        {"val_loss", eval.loss},
        {"perplexity", eval.perplexity()},
        {"first_val_loss", curve.front().second},
        {"train_loss", last_loss},
        {"tokens_per_second", tokens_per_second},
        {"train_seconds", train_s},
        {"timing_warmup", o.timing_warmup},
        {"timed_steps", timed_steps},
        {"timed_seconds", timed_s},
        {"timed_tokens_per_second",
         timed_steps > 0 ? nlohmann::json(timed_tokens_per_second) : nlohmann::json(nullptr)},
        {"wall_seconds", std::chrono::duration<double>(Clock::now() - started).count()},
        {"world_size", world.size()},
        {"dp", dp},
        {"tp", mesh.size(MeshDim::kTensor)},
        {"pp", mesh.size(MeshDim::kPipeline)},
        {"microbatches", pipe ? o.microbatches : 1},
        {"sequence_parallel", o.sequence_parallel},
        {"steps", o.steps},
        {"resumed_from_step", start},
        {"batch_size", o.batch_size},
        {"context", o.context},
        {"parameters", params},
        {"vocab_size", tokens.vocab_size},
        {"padded_vocab_size", padded_vocab},
        {"preset", o.preset.empty() ? "none" : o.preset},
        // What training ran (Note [Fused attention and sharded dropout]).
        {"attention", cohort::tensor_parallel::to_string(cohort::tensor_parallel::resolve_attention_kernel(
                          cohort::tensor_parallel::AttentionKernel::automatic, o.dropout, /*training=*/true))},
        {"peak_rss_mb_max_rank", rss.cpu().item<double>()},
        {"device", device.str()},
        {"amp", o.amp},
        {"zero", o.zero},
        {"activation_checkpointing", o.activation_checkpointing},
        {"comm_hook", strategy->name()},
        {"val_curve", curve_json},
        {"samples", texts.size()},
        {"checkpoints", checkpoints ? checkpoints->summary() : nlohmann::json(nullptr)},
    };
    summary.update(utilisation(flops, peak));
    std::cout << summary.dump() << std::endl;
  }
  return 0;
}

}  // namespace gpt
