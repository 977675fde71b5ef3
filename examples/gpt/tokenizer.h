#pragma once
// The tokenizer and the token streams: SentencePiece trains a BPE vocabulary on the
// training fortunes once, and the fortunes are encoded once; both are cached in a
// folder keyed by the corpus's hash and the vocabulary size (docs/gpt.md):
//
//   <cache>/<hash>-v<vocab>/tokenizer.model   SentencePiece's model
//                           train.bin val.bin token ids, int32 little-endian
//                           meta.json          vocab_size, eos_id, counts
//
// Each stream is the fortunes in order, each followed by the end-of-text id
// (eos_id), newlines inside a fortune read as spaces.
//
// SentencePiece runs in a program of its own, gpt_tokenize (Note [SentencePiece in
// its own process] in tokenize_main.cpp).
//
// Note [One builder per node]
// Only local rank 0 trains and encodes, in a private folder that it renames into
// place when complete (an atomic rename), so a reader never sees half a cache. The
// other local ranks poll for meta.json, bounded by build_timeout_s; their error
// names the rank and the folder. Nodes that share the folder may both build; the
// second rename loses and its copy is dropped, the two being the same.
#include <cstdint>
#include <string>
#include <vector>

#include "corpus.h"

namespace gpt {

struct TokenStreams {
  std::vector<std::int32_t> train;
  std::vector<std::int32_t> validation;
  int vocab_size = 0;  // SentencePiece's pieces (before padding for TP)
  int eos_id = 0;
  std::string folder;  // the cache entry
};

struct TokenCacheOptions {
  std::string cache_dir;  // empty: default_cache_dir()
  int vocab_size = 2048;
  bool build = true;  // local rank 0: build when missing; others: wait for it
  double build_timeout_s = 600;
  int rank = 0;          // for messages
  int builder_rank = 0;  // the global rank of this node's local rank 0
  std::string tool;      // gpt_tokenize; empty: the one beside this program
};

// $XDG_CACHE_HOME/cohort/gpt, else ~/.cache/cohort/gpt, else ./.cache/cohort/gpt.
std::string default_cache_dir();
// The cache entry's folder for this corpus and vocabulary.
std::string cache_entry(const std::string& cache_dir, const Corpus& corpus, int vocab_size);

// Loads the cache entry, building it first (builder) or waiting for it (Note [One
// builder per node]).
TokenStreams load_token_streams(const Corpus& corpus, const TokenCacheOptions& options);

// int32 little-endian token ids, as train.bin and val.bin hold them.
void write_tokens(const std::string& path, const std::vector<std::int32_t>& ids);
std::vector<std::int32_t> read_tokens(const std::string& path);

// Decodes ids to text with the cached vocabulary (tokenizer.vocab) as SentencePiece
// does for BPE pieces: the pieces joined, U+2581 read as a space, the leading one
// dropped, unknown pieces as " \u2047 ", end-of-text ids skipped.
class Tokenizer {
 public:
  explicit Tokenizer(const std::string& folder);
  std::string decode(const std::vector<int>& ids) const;
  int size() const { return static_cast<int>(pieces_.size()); }

 private:
  std::vector<std::string> pieces_;
};

}  // namespace gpt
