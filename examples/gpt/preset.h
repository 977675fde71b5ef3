#pragma once
// Named model sizes for the GPT trainer (--preset), and the vocabulary's padding.
// Without a preset the trainer keeps its CPU-sized defaults (options.h); a preset
// sets the model's flags to a known shape, and a flag given on the command line wins
// over the preset's value (Note [A preset under explicit flags] in preset.cpp):
//
//   gpt --preset gpt2-small                  GPT-2 small: 12 x 768, 12 heads, 1024 tokens
//   gpt --preset gpt2-small --context 256    the same, on 256-token windows
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gpt {

struct GptTrainerOptions;  // options.h

struct Preset {
  std::string name;
  std::int64_t layers, embed_dim, heads, context;
  int vocab_multiple;  // the padded vocabulary's multiple (--vocab-multiple)
  double lr;           // the peak learning rate (--lr)
};

// The presets --preset accepts, by name.
const std::vector<Preset>& presets();
std::vector<std::string> preset_names();

// Sets o's fields to o.preset's values, except the flags `given` says were on the
// command line. No preset (o.preset empty): nothing changes. An unknown name throws
// ConfigError naming the presets.
void apply_preset(GptTrainerOptions& o, const std::function<bool(const std::string& flag)>& given);

// The model's vocabulary: the tokenizer's `vocab_size` rounded up to a multiple of
// both `multiple` and the TP size (the vocabulary is split over the TP group). The
// padding's rows are never a target, and sampling skips them (Note [The padding is
// never a token] in preset.cpp).
std::int64_t padded_vocab_size(std::int64_t vocab_size, std::int64_t tp, std::int64_t multiple);

}  // namespace gpt
