#include "preset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

#include "cohort/errors.h"
#include "options.h"

namespace gpt {

// Note [A preset under explicit flags]
// A preset fills in the flags it names that the command line did not give: an
// explicit flag wins, wherever it stands (`--layers 2 --preset gpt2-small` and
// `--preset gpt2-small --layers 2` both give 2 layers). So a preset is a starting
// point to vary one size at a time, with nothing to refuse; what the sizes must
// satisfy together (--heads divides --embed-dim and is a multiple of --tp, ...) is
// checked afterwards on the result, the same as without a preset, and the trainer's
// first line prints the vocabulary it padded to.
//
// gpt2-small is GPT-2's smallest model (Radford et al., 2019; nanoGPT's gpt2): 12
// blocks of width 768 with 12 heads, a 1024-token context, the output layer tied to
// the token embedding, and the vocabulary padded to a multiple of 128 (nanoGPT's
// 50304 for GPT-2's 50257: whole tiles for the logits' matmul). Its vocabulary is
// this trainer's tokenizer's (--vocab-size, 2048 by default, padded to 2048), not
// GPT-2's; at GPT-2's 50257 tokens it has GPT-2's 124M parameters (preset_test).
// Its peak learning rate is GPT-2's 6e-4: the CPU default of 3e-3 is for a model a
// hundred times smaller. Dropout stays 0, so the attention runs fused (Note [Fused
// attention and sharded dropout] in src/cohort/tensor_parallel/attention.cpp).
//
// Note [The padding is never a token]
// The padded rows of the tied embedding are logits too, so they enter the softmax of
// the cross-entropy; no target is ever one of them (the token ids are the
// tokenizer's, below its vocab_size), so training only pushes their logits down, as
// nanoGPT's padding does. Sampling (sample.cpp) cuts the gathered logits to the
// tokenizer's vocabulary before the top-k and the softmax, so no padding row is ever
// drawn. Their rows start at zero (Note [The padding draws nothing] in model.cpp).

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all{
      {"gpt2-small", /*layers=*/12, /*embed_dim=*/768, /*heads=*/12, /*context=*/1024, /*vocab_multiple=*/128,
       /*lr=*/6e-4},
  };
  return all;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

void apply_preset(GptTrainerOptions& o, const std::function<bool(const std::string&)>& given) {
  if (o.preset.empty()) return;
  const Preset* p = nullptr;
  for (const auto& candidate : presets())
    if (candidate.name == o.preset) p = &candidate;
  if (p == nullptr)
    throw cohort::ConfigError(fmt::format("gpt: unknown --preset '{}'; the presets are: {}", o.preset,
                                          fmt::join(preset_names(), ", ")));
  if (!given("--layers")) o.layers = p->layers;
  if (!given("--embed-dim")) o.embed_dim = p->embed_dim;
  if (!given("--heads")) o.heads = p->heads;
  if (!given("--context")) o.context = p->context;
  if (!given("--vocab-multiple")) o.vocab_multiple = p->vocab_multiple;
  if (!given("--lr")) o.lr = p->lr;
}

std::int64_t padded_vocab_size(std::int64_t vocab_size, std::int64_t tp, std::int64_t multiple) {
  if (vocab_size < 1 || tp < 1 || multiple < 1)
    throw cohort::ConfigError(fmt::format("gpt: cannot pad a vocabulary of {} to a multiple of {} split over {} TP "
                                          "ranks; all three must be positive",
                                          vocab_size, multiple, tp));
  const auto step = std::lcm(tp, multiple);
  return (vocab_size + step - 1) / step * step;
}

}  // namespace gpt
