#include "options.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "cohort/errors.h"

namespace gpt {

std::optional<GptTrainerOptions> parse_options(int argc, char** argv) {
  GptTrainerOptions o;
  CLI::App app(
      "Trains a small GPT on the fortunes of Debian's `fortunes` package, split over a\n"
      "data x pipeline x tensor parallel mesh. Run it under `cohort run --nproc-per-node N`.\n"
      "docs/gpt.md explains the flags, the batches and the output.",
      "gpt");
  app.add_option("--dp", o.dp, "Data-parallel replicas (0: the world's size / (tp x pp))")->check(CLI::Range(0, 1 << 16));
  app.add_option("--tp", o.tp, "Tensor-parallel ranks per replica (consecutive ranks: one node's)")
      ->check(CLI::Range(1, 64));
  app.add_option("--pp", o.pp, "Pipeline stages (consecutive blocks each; 1F1B schedule)")->check(CLI::Range(1, 64));
  app.add_option("--microbatches", o.microbatches,
                 "Micro-batches per step and data-parallel replica under --pp > 1 (0: --pp)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "Keep the activations between blocks sharded along the sequence over the TP group");
  app.add_option("--zero", o.zero,
                 "ZeRO stage over the data-parallel ranks: 0 (DDP), 1 (optimizer state sharded), 2 (and the "
                 "gradients), 3 (and the parameters; docs/zero.md)")
      ->check(CLI::Range(0, 3));
  app.add_option("--amp", o.amp, "Mixed precision: none, or bf16 (autocast)")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  app.add_flag("--activation-checkpointing", o.activation_checkpointing,
               "Recompute each transformer block's activations in backward instead of keeping them");
  app.add_option("--layers", o.layers, "Transformer blocks")->check(CLI::Range(1, 256));
  app.add_option("--embed-dim", o.embed_dim, "Width of the residual stream")->check(CLI::Range(1, 1 << 16));
  app.add_option("--heads", o.heads, "Attention heads (divisible by --tp)")->check(CLI::Range(1, 1024));
  app.add_option("--context", o.context, "Tokens per training window")->check(CLI::Range(2, 1 << 16));
  app.add_option("--dropout", o.dropout, "Dropout on the embeddings, attention and residual branches")
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--steps", o.steps, "Optimizer steps")->check(CLI::Range(1, 1 << 30));
  app.add_option("--batch-size", o.batch_size, "Windows per step over all data-parallel replicas (global)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", o.lr, "Peak learning rate of AdamW (after warmup; cosine decay to a tenth)")
      ->check(CLI::Range(1e-9, 10.0));
  app.add_option("--warmup-steps", o.warmup_steps, "Linear warmup steps (-1: a tenth of --steps)")
      ->check(CLI::Range(-1, 1 << 30));
  app.add_option("--weight-decay", o.weight_decay, "AdamW's decoupled weight decay")->check(CLI::Range(0.0, 1.0));
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "Clip the gradients to this norm of the whole model, counted once across TP, pipeline stages and "
                 "ZeRO-3 shards (0: off; docs/clipping.md)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--optimizer-kernel", o.optimizer_kernel,
                 "How AdamW steps: auto (fused where LibTorch has it, else per parameter on the CPU and over "
                 "lists on a GPU), for-loop (torch::optim's), foreach, or fused (docs/optimizers.md)")
      ->check(CLI::IsMember({"auto", "for-loop", "foreach", "fused"}));
  app.add_option("--seed", o.seed, "Seed of the initial weights, dropout and the sample");
  app.add_option("--eval-every", o.eval_every, "Steps between validation passes (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-batches", o.eval_batches, "Validation batches of --batch-size windows per pass")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--device", o.device, "cpu, cuda, or auto (cuda when LibTorch has it and a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--fortunes-dir", o.fortunes_dir, "The fortune files (Debian's `fortunes` package)")
      ->capture_default_str();
  app.add_option("--cache-dir", o.cache_dir,
                 "Where the tokenizer and the token ids are cached (default: $XDG_CACHE_HOME/cohort/gpt or "
                 "~/.cache/cohort/gpt)");
  app.add_option("--vocab-size", o.vocab_size, "SentencePiece BPE pieces (padded to a multiple of --tp)")
      ->check(CLI::Range(256, 1 << 20));
  // --preset (preset.h): after parsing, the preset's value for each of its flags the
  // command line did not give (Note [A preset under explicit flags] in preset.cpp).
  app.add_option("--vocab-multiple", o.vocab_multiple,
                 "Pad the model's vocabulary to a multiple of this (and of --tp); the padding is never a token")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--preset", o.preset,
                 "A model size: gpt2-small (12 layers, width 768, 12 heads, context 1024, vocabulary padded to a "
                 "multiple of 128, --lr 6e-4); flags given explicitly override its values")
      ->check(CLI::IsMember(preset_names()));
  app.final_callback([&app, &o] { apply_preset(o, [&app](const std::string& flag) { return app.count(flag) > 0; }); });
  app.add_option("--samples", o.samples, "Texts sampled from the model at the end")->check(CLI::Range(0, 100));
  app.add_option("--sample-tokens", o.sample_tokens, "Tokens per sample at most (it stops at a fortune's end)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--temperature", o.temperature, "Sampling temperature")->check(CLI::Range(1e-3, 100.0));
  app.add_option("--top-k", o.top_k, "Sample among the k likeliest tokens (0: all)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--save-initial", o.save_initial,
                 "Write the whole model's initial weights here (torch.load-able, gathered over TP)");
  app.add_option("--dump-data", o.dump_data,
                 "Write train.bin and val.bin (int32 little-endian token ids) and meta.json to this folder");
  app.add_flag("--log-losses", o.log_losses,
               "Print every step's training loss as `step N loss X` (and ` grad_norm Y`, the norm before "
               "clipping, with --clip-grad-norm)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "Save checkpoints here, and resume from the newest one at start (any --tp and --dp)");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "Steps between checkpoints under --checkpoint-dir (0: only at the end); the last step is always saved")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-format", o.checkpoint_format,
                 "cohort: model.pt, optimizer.pt; dcp: PyTorch's distributed checkpoint format, which "
                 "torch.distributed.checkpoint.load reads (docs/checkpoints.md). Either loads")
      ->check(CLI::IsMember({"cohort", "dcp"}));
  app.add_flag("--checkpoint-async", o.checkpoint_async,
               "Save checkpoints asynchronously: the step pays for a copy into host memory, a thread writes "
               "(docs/checkpoints.md)");
  app.add_option("--checkpoint-when-busy", o.checkpoint_when_busy,
                 "With --checkpoint-async, a checkpoint due while the last one is still being written: wait for "
                 "it, or skip this one")
      ->check(CLI::IsMember({"wait", "skip"}));
  app.add_option("--stop-after", o.stop_after,
                 "Save a checkpoint after this step and exit, as an interrupted run would (needs --checkpoint-dir)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timing-warmup", o.timing_warmup,
                 "Leave the first N steps out of tokens_per_second and mfu: the device is synchronised after step N "
                 "and after the last, and the steps between are timed (0: every step, each timed on the host)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--peak-tflops", o.peak_tflops,
                 "The peak per process that mfu divides by, in TFLOP/s (0: measured on the CPU; on a GPU the "
                 "device's dense bf16 peak from its datasheet, by name; docs/gpt.md)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-interval", o.log_interval_s, "Seconds between progress lines")
      ->check(CLI::Range(0.0, 3600.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw cohort::ConfigError(std::string("gpt: ") + e.what() + "\nRun with --help for the flags.");
  }
  // Note [Refusals reach the launcher] in examples/fashion_mnist/main.cpp.
  auto refuse = [](const std::string& why) {
    throw cohort::ConfigError("gpt: " + why + "\nRun with --help for the flags.");
  };
  const auto n = [](auto v) { return std::to_string(v); };
  if (o.pp > o.layers)
    refuse("--pp " + n(o.pp) + " stages cannot split --layers " + n(o.layers) +
           " blocks (each stage needs at least one); use --pp " + n(o.layers) + " or fewer, or more --layers");
  if (o.amp == "fp16")
    refuse("--amp fp16 needs a GradScaler, which the GPT example does not wire; use --amp bf16 (or none)");
  if (o.heads % o.tp != 0)
    refuse("--heads " + n(o.heads) + " cannot be split over --tp " + n(o.tp) +
           " ranks (attention is split by heads); make --heads a multiple of --tp");
  if (o.embed_dim % o.heads != 0)
    refuse("--embed-dim " + n(o.embed_dim) + " is not a multiple of --heads " + n(o.heads) +
           "; each head takes embed_dim / heads features");
  if (o.clip_grad_norm > 0 && o.zero == 2)
    refuse("--clip-grad-norm with --zero 2: the ZeRO-2 optimizer finishes reducing the gradients inside its "
           "step, after they would be clipped; use --zero 1 or 3 with clipping, or leave --clip-grad-norm out");
  if (o.sequence_parallel && o.context % o.tp != 0)
    refuse("--sequence-parallel shards the --context of " + n(o.context) + " tokens over --tp " + n(o.tp) +
           " ranks; make --context a multiple of --tp");
  // ZeRO-2 reduces each gradient to its owner during backward, into the parameter's
  // own .grad, where sum_replicated_gradients then sums it over the TP group
  // (docs/tensor_parallel.md; gpt_parity_worker's dp2_tp2_zero2). ZeRO-3's gradients
  // are in fully_shard's flat shards instead (Note [Sequence-parallel gradients under
  // ZeRO-3] in src/cohort/tensor_parallel/composition.cpp).
  if (o.sequence_parallel && o.zero == 3)
    refuse("--sequence-parallel with --zero 3: ZeRO-3 keeps the gradients in fully_shard's flat shards over the "
           "data-parallel ranks, where the replicated parameters' gradients cannot be summed over the TP group "
           "(which sequence parallelism needs); use --zero 0, 1 or 2 with --sequence-parallel");
  if (o.dp > 0 && o.batch_size % o.dp != 0)
    refuse("--batch-size " + n(o.batch_size) + " cannot be split evenly over --dp " + n(o.dp) +
           " replicas; make it a multiple of --dp");
  if (o.stop_after > 0 && o.checkpoint_dir.empty())
    refuse("--stop-after " + n(o.stop_after) +
           " saves a checkpoint to resume from, and there is no --checkpoint-dir; give one");
  if (o.checkpoint_async && o.checkpoint_dir.empty())
    refuse("--checkpoint-async saves the checkpoints of --checkpoint-dir asynchronously, and there is none; give "
           "--checkpoint-dir, or drop --checkpoint-async");
  if (o.checkpoint_format != "cohort" && o.checkpoint_dir.empty())
    refuse("--checkpoint-format " + o.checkpoint_format + " is the format of --checkpoint-dir's checkpoints, and "
           "there is none; give --checkpoint-dir, or drop --checkpoint-format");
  if (o.checkpoint_when_busy != "wait" && !o.checkpoint_async)
    refuse("--checkpoint-when-busy " + o.checkpoint_when_busy + " applies to --checkpoint-async; add it, or drop "
           "--checkpoint-when-busy");
  if (o.timing_warmup >= o.steps)
    refuse("--timing-warmup " + n(o.timing_warmup) + " leaves none of the " + n(o.steps) +
           " --steps to time; make it smaller than --steps");
  if (o.microbatches == 0) o.microbatches = o.pp;
  if (o.warmup_steps < 0) o.warmup_steps = o.steps / 10;
  return o;
}

}  // namespace gpt
