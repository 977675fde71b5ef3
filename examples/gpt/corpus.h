#pragma once
// The corpus: the plain-text fortune files of Debian's `fortunes` package, in which
// fortunes are separated by lines holding only `%`. Every 10th fortune is held out
// for validation (docs/gpt.md).
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct Corpus {
  std::vector<std::string> train;
  std::vector<std::string> validation;
  std::uint64_t hash = 0;  // of every fortune in order, with the split
};

// The fortunes of one file's text: split at lines holding `%` (trailing spaces and
// a '\r' allowed), each trimmed of surrounding blank space; empty ones dropped.
std::vector<std::string> split_fortunes(const std::string& text);

// Fortune i (0-based, over every file in order) goes to validation when
// i % every == every - 1, to training otherwise.
Corpus split_corpus(const std::vector<std::string>& fortunes, int every = 10);

// The plain-text files of `dir` (no extension: not *.dat, *.u8, nor folders such as
// off/), sorted by name, their fortunes in order. ConfigError naming the package
// when the folder is missing or holds no fortunes.
std::vector<std::string> read_fortunes(const std::string& dir);

// FNV-1a, 64 bits: the cache's key.
std::uint64_t fnv1a(const std::string& bytes, std::uint64_t hash = 14695981039346656037ULL);

}  // namespace gpt
