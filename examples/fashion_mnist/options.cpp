#include "options.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "cohort/errors.h"

namespace fashion_mnist {

std::optional<TrainerOptions> parse_options(int argc, char** argv) {
  TrainerOptions o;
  CLI::App app(
      "Trains a small CNN on Fashion-MNIST with cohort's DistributedDataParallel.\n"
      "Run it under `cohort run --nproc-per-node N`, or alone for a world of one.\n"
      "With --checkpoint-dir it resumes from the newest good checkpoint there.",
      "fashion_mnist");
  app.add_option("--epochs", o.epochs, "Passes over the training set")->check(CLI::Range(1, 1000));
  app.add_option("--batch-size", o.batch_size, "Samples per step on each rank")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", o.lr, "Learning rate (the peak, with --schedule cosine)")
      ->check(CLI::Range(1e-9, 10.0));
  app.add_option("--optimizer", o.optimizer, "adam, or sgd (with momentum 0.9)")
      ->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--optimizer-kernel", o.optimizer_kernel,
                 "How the optimizer steps: auto (fused where LibTorch has it, else per parameter on the CPU and "
                 "over lists on a GPU), for-loop (torch::optim's), foreach, or fused (docs/optimizers.md)")
      ->check(CLI::IsMember({"auto", "for-loop", "foreach", "fused"}));
  app.add_flag("--cuda-graphs", o.cuda_graphs,
               "Capture the whole step (forward, backward, DDP's all-reduce over NCCL, the fused optimizer step) "
               "into one CUDA graph after a few eager steps, and replay it (docs/cuda_graphs.md)");
  app.add_option("--schedule", o.schedule, "Learning rate over the run: cosine decay to 0, or constant")
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--seed", o.seed, "Seed of the initial weights and of the shuffling");
  app.add_option("--data-dir", o.data_dir, "Directory of the four Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "Where to save checkpoints and resume from");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "Steps between checkpoints (0: only at the end of each epoch)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-checkpoints", o.keep_checkpoints, "How many checkpoints to keep")
      ->check(CLI::Range(1, 1000));
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
  app.add_option("--save-final", o.save_final, "Write the final weights here, as a state dict for torch.load");
  app.add_option("--limit-train-batches", o.limit_train_batches, "Steps per epoch at most (0: all), for quick runs")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", o.max_steps,
                 "Stop after this many steps in all, counting those before a resume, with a checkpoint "
                 "there (0: run every epoch); a later run without it continues")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device", o.device, "cpu, cuda, or auto (cuda when LibTorch has it and a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_flag("--deterministic", o.deterministic,
               "Bitwise-reproducible: same seed, world size and threads per worker (OMP_NUM_THREADS), "
               "same final weights, also across a resume");
  app.add_option("--log-interval", o.log_interval_s, "Seconds between progress lines when not on a terminal")
      ->check(CLI::Range(0.0, 3600.0));
  auto* memory_format = app.add_option("--memory-format", o.memory_format,
                 "Layout of the convolutions: channels-last (NHWC, faster with oneDNN) or contiguous (NCHW); "
                 "contiguous under --zero 3")
      ->check(CLI::IsMember({"channels-last", "contiguous"}));
  app.add_option("--straggler-every", o.straggler_every,
                 "Steps between straggler reports (each rank's median and p90 step time); 0: at the end only")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--straggler-threshold", o.straggler_threshold,
                 "Name the ranks slower than the fastest by more than this fraction")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--pipeline-stages", o.pipeline_stages,
                 "Cut the model into this many pipeline stages, one per rank; with --nproc-per-node N the job "
                 "runs N/S data-parallel replicas of the pipeline (1: no pipeline)")
      ->check(CLI::Range(1, 4));
  app.add_option("--microbatches", o.microbatches, "Micro-batches per step in the pipeline (0: twice the stages)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--pipeline-schedule", o.pipeline_schedule, "gpipe, 1f1b, interleaved or zero-bubble")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zero-bubble"}));
  app.add_option("--virtual-stages", o.virtual_stages, "Stages per rank for --pipeline-schedule interleaved")
      ->check(CLI::Range(1, 4));
  app.add_flag("--activation-checkpointing", o.activation_checkpointing,
               "Recompute activations in backward instead of keeping them: the convolution blocks, or with "
               "--pipeline-stages each stage's forward");
  app.add_option("--amp", o.amp,
                 "Mixed precision: bf16 (autocast; the CPU's), fp16 (autocast and a GradScaler; CUDA) or off")
      ->check(CLI::IsMember({"bf16", "fp16", "off"}));
  app.add_option("--data-parallel-replicas", o.data_parallel_replicas,
                 "One process, this many replicas of the model: on the CPU, or one per GPU with --device cuda "
                 "(DataParallel; DDP with one process per device is faster)")
      ->check(CLI::Range(1, 64));
  std::string comm_hook = "allreduce";
  app.add_option("--comm-hook", comm_hook,
                 "How DDP reduces gradients: allreduce, fp16 or bf16 (compressed casts), or powersgd[:RANK] "
                 "(low-rank, default rank 1; docs/ddp.md)");
  app.add_option("--powersgd-start", o.powersgd_start,
                 "Plain all-reduce steps before PowerSGD starts compressing (at least 2: DDP rebuilds its buckets "
                 "after the first)")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 40));
  app.add_option("--zero", o.zero,
                 "ZeRO stage: 0, the whole optimizer on every rank; 1, its state sharded over the ranks; 2, "
                 "its state and the gradients sharded; 3, the parameters sharded too, gathered layer by layer "
                 "(docs/zero.md)")
      ->check(CLI::Range(0, 3));
  app.add_flag("--fault-tolerance", o.fault_tolerance,
               "Survive a lost replica in-process: the others redo the step and go on, a replacement takes the "
               "weights from a live one; start with `cohort run --fault-tolerance in-process` "
               "(docs/fault_tolerance.md). --batch-size is then per rank of the full job");
  app.add_option("--shards-per-replica", o.shards_per_replica,
                 "With --fault-tolerance and --zero 1 or 2: each replica is this many ranks, which shard the "
                 "optimizer among themselves; a lost rank costs its replica, not the job (docs/fault_tolerance.md)")
      ->check(CLI::Range(1, 1 << 16));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw cohort::ConfigError(std::string("fashion_mnist: ") + e.what() + "\nRun with --help for the flags.");
  }
  // Note [Refusals reach the launcher] in main.cpp.
  auto refuse = [](const std::string& why) {
    throw cohort::ConfigError("fashion_mnist: " + why + "\nRun with --help for the flags.");
  };
  if (o.microbatches == 0) o.microbatches = 2 * o.pipeline_stages;
  if (o.pipeline_stages == 1 && (o.pipeline_schedule != "1f1b" || o.virtual_stages != 1))
    refuse("--pipeline-schedule and --virtual-stages need --pipeline-stages 2 or more");
  if (o.pipeline_stages * o.virtual_stages > 4)
    refuse("--pipeline-stages " + std::to_string(o.pipeline_stages) + " x --virtual-stages " +
           std::to_string(o.virtual_stages) + " asks for " + std::to_string(o.pipeline_stages * o.virtual_stages) +
           " stages, but the model has 4 layers with weights (conv1, conv2, fc1, fc2); use at most 4 in all");
  if (o.data_parallel_replicas > 1 && o.pipeline_stages > 1)
    refuse("--data-parallel-replicas and --pipeline-stages do not combine; use one or the other");
  const auto colon = comm_hook.find(':');
  o.comm_hook = comm_hook.substr(0, colon);
  if (o.comm_hook != "allreduce" && o.comm_hook != "fp16" && o.comm_hook != "bf16" && o.comm_hook != "powersgd")
    refuse("--comm-hook " + comm_hook + ": not one of allreduce, fp16, bf16, powersgd[:RANK]");
  if (colon != std::string::npos) {
    const auto rank = comm_hook.substr(colon + 1);
    if (o.comm_hook != "powersgd" || rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos ||
        rank.size() > 6 || std::stoll(rank) < 1)
      refuse("--comm-hook " + comm_hook + ": only powersgd takes a rank, a whole number of at least 1 "
             "(powersgd:2)");
    o.powersgd_rank = std::stoll(rank);
  }
  if (o.comm_hook != "allreduce" && (o.pipeline_stages > 1 || o.data_parallel_replicas > 1))
    refuse("--comm-hook applies to the DDP of plain data parallelism; it does not combine with --pipeline-stages "
           "or --data-parallel-replicas yet");
  if (o.zero >= 1 && (o.pipeline_stages > 1 || o.data_parallel_replicas > 1))
    refuse("--zero " + std::to_string(o.zero) + " shards the optimizer over the data-parallel ranks of plain "
           "data parallelism; it does not combine with --pipeline-stages or --data-parallel-replicas yet");
  if (o.zero >= 2 && o.comm_hook != "allreduce")
    refuse("--zero " + std::to_string(o.zero) + " reduces the gradients itself, in place of DDP and its "
           "communication hooks; --comm-hook " + comm_hook + " needs --zero 0 or 1");
  if (o.zero == 3 && memory_format->count() == 0) o.memory_format = "contiguous";
  if (o.zero == 3 && o.memory_format == "channels-last")
    refuse("--zero 3 keeps every parameter in one flat, contiguous buffer per layer, so the convolutions' "
           "channels-last weights would be lost; use --memory-format contiguous with --zero 3");
  if (o.amp == "fp16" && o.device == "cpu")
    refuse("--amp fp16 needs --device cuda (the CPU runs autocast in bfloat16); use --amp bf16 on the CPU");
  if (o.cuda_graphs) {
    // Note [What a captured step composes with] (cuda_graphs.cpp): plain DDP over
    // NCCL, with what keeps no host decision in the step.
    auto refuse_with = [&](bool given, const std::string& flag, const std::string& why) {
      if (given) refuse("--cuda-graphs with " + flag + ": " + why);
    };
    refuse_with(o.device == "cpu", "--device cpu", "CUDA graphs capture CUDA kernels; use --device cuda");
    refuse_with(o.fault_tolerance, "--fault-tolerance", "re-forming DDP over the live replicas changes the step, "
                "which a graph replays unchanged; drop one of the two");
    refuse_with(o.pipeline_stages > 1, "--pipeline-stages", "a pipeline's schedule sends and waits between stages "
                "on the host; use --pipeline-stages 1");
    refuse_with(o.data_parallel_replicas > 1, "--data-parallel-replicas", "DataParallel scatters and gathers over "
                "several GPUs from the host; use one process per GPU (cohort run --nproc-per-node)");
    refuse_with(o.zero > 0, "--zero " + std::to_string(o.zero), "the sharded optimizers are not capturable yet; "
                "use --zero 0");
    refuse_with(o.amp == "fp16", "--amp fp16", "the GradScaler reads on the host whether a step overflowed, to "
                "skip it; use --amp bf16 (no scaler) or off");
    refuse_with(o.comm_hook != "allreduce", "--comm-hook " + o.comm_hook, "a hook may keep host state between "
                "steps (PowerSGD does); use --comm-hook allreduce");
    refuse_with(o.activation_checkpointing, "--activation-checkpointing", "recomputation saves and restores the "
                "RNG's state on the host; drop --activation-checkpointing");
    refuse_with(o.optimizer_kernel == "for-loop" || o.optimizer_kernel == "foreach",
                "--optimizer-kernel " + o.optimizer_kernel, "only the fused kernels read the learning rate and "
                "step counts from the device, where a replay can change them; use --optimizer-kernel fused (or "
                "auto)");
  }
  if (o.fault_tolerance) {
    // Note [What fault tolerance composes with]: the replica group re-forms DDP over
    // the live replicas; a strategy that keeps state on each rank (ZeRO's shards, a
    // pipeline's stages, the fp16 scaler) would lose it with the rank. What keeps
    // none composes: bf16 autocast, activation checkpointing, the memory format.
    auto alone = [&](bool given, const std::string& flag, const std::string& why) {
      if (given) refuse("--fault-tolerance with " + flag + ": " + why);
    };
    alone(o.zero == 3, "--zero 3", "sharded parameters are not wired into the fault-tolerant loop; use --zero 1 or 2 "
          "with --shards-per-replica 2 or more");
    alone((o.zero == 1 || o.zero == 2) && o.shards_per_replica < 2, "--zero " + std::to_string(o.zero),
          "shards over the ranks of one replica, and a replica of one rank would take its shard of the optimizer "
          "state with it; add --shards-per-replica 2 (or more), so that each replica is several ranks and a lost "
          "rank's shard lives on in the other replicas");
    alone(o.pipeline_stages > 1, "--pipeline-stages", "a lost stage cannot be redone by the other stages; use "
          "--pipeline-stages 1");
    alone(o.data_parallel_replicas > 1, "--data-parallel-replicas",
          "replicas inside one process die together; use processes (cohort run --nproc-per-node)");
    alone(o.amp == "fp16", "--amp fp16",
          "the GradScaler's skipped steps are not wired into the fault-tolerant loop; use --amp bf16 or off");
    alone(o.comm_hook != "allreduce", "--comm-hook " + o.comm_hook,
          "a hook's state (PowerSGD's error feedback) is per group; use --comm-hook allreduce");
    alone(o.device != "cpu", "--device " + o.device, "the replica group's collectives run on Gloo; use --device cpu");
    alone(o.straggler_every > 0, "--straggler-every",
          "straggler reports are collectives over a fixed world, which a fault-tolerant job does not have; drop "
          "--straggler-every here, and find slow ranks in a run without --fault-tolerance (its straggler report, "
          "docs/timeline.md)");
  }
  if (o.checkpoint_async && o.checkpoint_dir.empty())
    refuse("--checkpoint-async saves the checkpoints of --checkpoint-dir asynchronously, and there is none; give "
           "--checkpoint-dir, or drop --checkpoint-async");
  if (o.checkpoint_async && o.fault_tolerance)
    refuse("--checkpoint-async with --fault-tolerance: the fault-tolerant loop's checkpoints are synchronous "
           "for now; drop --checkpoint-async");
  if (o.checkpoint_format != "cohort" && o.checkpoint_dir.empty())
    refuse("--checkpoint-format " + o.checkpoint_format + " is the format of --checkpoint-dir's checkpoints, and "
           "there is none; give --checkpoint-dir, or drop --checkpoint-format");
  if (o.checkpoint_format == "dcp" && o.fault_tolerance)
    refuse("--checkpoint-format dcp with --fault-tolerance: the fault-tolerant loop keeps its own checkpoints; "
           "drop --checkpoint-format");
  if (o.checkpoint_when_busy != "wait" && !o.checkpoint_async)
    refuse("--checkpoint-when-busy " + o.checkpoint_when_busy + " applies to --checkpoint-async; add it, or drop "
           "--checkpoint-when-busy");
  if (o.shards_per_replica > 1 && (!o.fault_tolerance || o.zero == 0))
    refuse("--shards-per-replica " + std::to_string(o.shards_per_replica) + " cuts fault-tolerant replicas for "
           "ZeRO; it needs --fault-tolerance and --zero 1 or 2");
  if (o.pipeline_stages > 1 && o.microbatches > o.batch_size)
    refuse("--microbatches " + std::to_string(o.microbatches) + " is more than --batch-size " +
           std::to_string(o.batch_size) + "; every micro-batch needs a sample");
  return o;
}

}  // namespace fashion_mnist
