#pragma once
// The GPT trainer's flags (docs/gpt.md). Parsed once, at the edge, into this struct.
#include <cstdint>
#include <optional>
#include <string>

#include "preset.h"  // --preset

namespace gpt {

struct GptTrainerOptions {
  // The mesh (comm::DeviceMesh): data x pipeline x tensor parallel.
  int dp = 0;  // 0: the world's size / (tp x pp)
  int tp = 2;
  int pp = 1;
  int microbatches = 0;  // per step and data rank, under --pp > 1 (1F1B); 0: --pp
  bool sequence_parallel = false;
  int zero = 0;                 // over the data-parallel dimension
  std::string amp = "none";     // none | bf16
  bool activation_checkpointing = false;
  // The model. A preset (preset.h) sets the model's flags not given explicitly.
  std::string preset;  // empty: none, the CPU-sized defaults below
  std::int64_t layers = 4;
  std::int64_t embed_dim = 128;
  std::int64_t heads = 4;
  std::int64_t context = 64;
  double dropout = 0.0;
  // The run.
  std::int64_t steps = 600;
  std::int64_t batch_size = 32;  // global: over every data-parallel replica
  double lr = 3e-3;              // the peak, after warmup
  std::int64_t warmup_steps = -1;  // -1: a tenth of --steps
  double weight_decay = 0.01;
  double clip_grad_norm = 0;             // > 0: the gradients' whole-model norm clipped to it (docs/clipping.md)
  std::string optimizer_kernel = "auto";  // auto | for-loop | foreach | fused (cohort::optim::StepKernel)
  std::uint64_t seed = 0;
  std::int64_t eval_every = 150;  // steps; 0: only at the end
  std::int64_t eval_batches = 8;
  std::string device = "cpu";  // cpu | cuda | auto
  // Data.
  std::string fortunes_dir = "/usr/share/games/fortunes";
  std::string cache_dir;  // empty: $XDG_CACHE_HOME/cohort/gpt or ~/.cache/cohort/gpt
  int vocab_size = 2048;  // SentencePiece BPE pieces, before padding to the TP size
  int vocab_multiple = 1;  // the model's vocabulary: padded to a multiple of this and of --tp
  // The sample at the end.
  int samples = 3;
  int sample_tokens = 48;
  double temperature = 0.8;
  int top_k = 40;
  // For a Python peer (benchmarks/): initial weights, token ids, per-step losses.
  std::string save_initial;
  std::string dump_data;
  bool log_losses = false;
  // Checkpoints (checkpoints.h): none without a directory.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 100;  // steps; 0: only the last (and --stop-after's)
  std::int64_t stop_after = 0;          // >0: save and exit after this step (for tests)
  std::string checkpoint_format = "cohort";  // cohort | dcp: PyTorch's distributed checkpoint format
  bool checkpoint_async = false;        // a writer thread writes them (docs/checkpoints.md)
  std::string checkpoint_when_busy = "wait";  // wait | skip: a save due while one is in flight
  double log_interval_s = 10.0;  // seconds between progress lines
  // Throughput and MFU (performance.h).
  std::int64_t timing_warmup = 0;  // first steps left out of tokens/s and mfu
  double peak_tflops = 0;          // > 0: the peak per process for mfu, instead of the measured or the table's
};

// Parses argv. Returns nullopt after printing help. On a bad flag, prints what is
// wrong (naming the flag) and exits with status 2, as command-line tools do.
// Combinations that depend on the world's size (--dp x --tp x --pp) are checked by
// the mesh, once the world is up.
std::optional<GptTrainerOptions> parse_options(int argc, char** argv);

}  // namespace gpt
