#pragma once
// The trainer's flags. Parsed once, at the edge, into this struct.
#include <cstdint>
#include <optional>
#include <string>

namespace fashion_mnist {

struct TrainerOptions {
  int epochs = 2;
  int batch_size = 32;  // per rank
  double lr = 2e-3;
  std::string optimizer = "adam";  // adam | sgd (momentum 0.9)
  std::string optimizer_kernel = "auto";  // auto | for-loop | foreach | fused (cohort::optim::StepKernel)
  std::string schedule = "cosine";  // cosine | constant
  std::uint64_t seed = 0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint_dir;  // empty: no checkpoints, no resume
  std::int64_t checkpoint_every = 0;  // steps; 0: only at the end of each epoch
  int keep_checkpoints = 3;
  std::string checkpoint_format = "cohort";  // cohort | dcp: PyTorch's distributed checkpoint format
  bool checkpoint_async = false;  // save() copies to host memory; a thread writes (docs/checkpoints.md)
  std::string checkpoint_when_busy = "wait";  // wait | skip: a save due while one is still being written
  std::string save_final;  // a Python-loadable state dict
  std::int64_t limit_train_batches = 0;  // per epoch; 0: all
  std::int64_t max_steps = 0;  // stop after this many steps in all (with a checkpoint); 0: never
  std::string device = "cpu";  // cpu | cuda | auto
  bool deterministic = false;
  double log_interval_s = 5.0;  // seconds between plain progress lines
  std::string memory_format = "channels-last";  // channels-last | contiguous (conv weights and input)
  std::int64_t straggler_every = 0;  // steps between straggler reports; 0: at the end only
  double straggler_threshold = 0.2;  // a rank over 20% slower than the fastest is named
  // Pipeline parallelism (docs/pipeline.md): 1 stage is plain DDP.
  int pipeline_stages = 1;
  int microbatches = 0;  // 0: twice the stages
  std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b | interleaved | zero-bubble
  int virtual_stages = 1;  // stages per rank, interleaved only
  bool activation_checkpointing = false;  // recompute each stage's forward in backward
  int data_parallel_replicas = 1;  // >1: one process, this many replicas (cohort::dp)
  std::string amp = "off";  // bf16 | fp16 | off (docs/amp.md)
  std::string comm_hook = "allreduce";  // allreduce | fp16 | bf16 | powersgd (docs/ddp.md)
  std::int64_t powersgd_rank = 1;  // from --comm-hook powersgd:RANK
  std::int64_t powersgd_start = 100;  // --powersgd-start: plain steps before compression
  bool fault_tolerance = false;  // in-process recovery (docs/fault_tolerance.md); under cohort run --fault-tolerance in-process
  int shards_per_replica = 1;  // with --fault-tolerance and --zero 1|2: ranks per replica, which shard the optimizer
  bool cuda_graphs = false;  // the whole step as one CUDA graph (cuda_graphs.cpp, docs/cuda_graphs.md)
  int zero = 0;  // 0 | 1 | 2 | 3: the optimizer's state sharded, at 2 the gradients, at 3 the parameters (docs/zero.md)
};

// Parses argv. Returns nullopt after printing help. On a bad flag, throws a
// cohort::ConfigError saying what is wrong (naming the flag); main.cpp records it and
// exits with status 2, as command-line tools do.
std::optional<TrainerOptions> parse_options(int argc, char** argv);

}  // namespace fashion_mnist
