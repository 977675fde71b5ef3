#pragma once
// What a Python peer (benchmarks/) needs to replay a run without cohort or
// SentencePiece: the whole model's initial weights and the token streams.
#include <string>

#include "cohort/comm/group.h"
#include "model.h"
#include "tokenizer.h"

namespace gpt {

// Collective over the TP group: the whole model's state dict, each TP slice gathered
// and joined along the dimension it was split on (the vocabulary's and
// column-parallel layers' rows, row-parallel layers' columns), on TP rank 0; empty
// elsewhere. Names as model.h lists them.
c10::Dict<std::string, at::Tensor> whole_state(GptImpl& model, cohort::comm::Group& tp);

// --save-initial: collective over the TP group; `write` (world rank 0) writes it in
// torch.save's format.
void save_whole_state(GptImpl& model, cohort::comm::Group& tp, bool write, const std::string& path);

// --dump-data: train.bin and val.bin (int32 little-endian) and meta.json (vocab_size,
// padded_vocab_size, eos_id, token counts) in `dir`.
void dump_data(const TokenStreams& streams, int padded_vocab_size, const std::string& dir);

}  // namespace gpt
