// The tokenizer's cache (examples/gpt/tokenizer.h): built once by gpt_tokenize, read
// back, decoded, and waited for with a bound.
#include <gtest/gtest.h>

#include <filesystem>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/errors.h"
#include "corpus.h"
#include "support/temp_dir.h"
#include "tokenizer.h"

namespace {

namespace fs = std::filesystem;

gpt::Corpus small_corpus() {
  // Enough distinct words for a vocabulary of 150 pieces.
  const char* syllables[] = {"ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "fu", "gi", "ba"};
  std::vector<std::string> fortunes;
  for (int i = 0; i < 400; ++i) {
    std::string f;
    for (int w = 0; w < 8; ++w) {
      f += syllables[(i * 7 + w * 3) % 12];
      f += syllables[(i + w * 5) % 12];
      f += w == 3 ? "\n" : " ";
    }
    fortunes.push_back(f + "end.");
  }
  return gpt::split_corpus(fortunes);
}

gpt::TokenCacheOptions options(const std::string& dir) {
  gpt::TokenCacheOptions o;
  o.cache_dir = dir;
  o.vocab_size = 150;
  o.tool = COHORT_GPT_TOKENIZE_PATH;
  return o;
}

TEST(GptTokenizerCache, BuildsOnceAndRoundTrips) {
  cohort::testing::TempDir dir("cohort-gpt-cache");
  const auto corpus = small_corpus();
  const auto first = gpt::load_token_streams(corpus, options(dir.path));
  EXPECT_EQ(first.vocab_size, 150);
  EXPECT_EQ(first.eos_id, 1);
  ASSERT_FALSE(first.train.empty());
  ASSERT_FALSE(first.validation.empty());
  // One end-of-text id per fortune.
  EXPECT_EQ(std::count(first.train.begin(), first.train.end(), 1), static_cast<long>(corpus.train.size()));
  EXPECT_EQ(std::count(first.validation.begin(), first.validation.end(), 1),
            static_cast<long>(corpus.validation.size()));
  // The first fortune decodes back, its newline read as a space.
  const auto end = std::find(first.train.begin(), first.train.end(), 1);
  std::string expected = corpus.train[0];
  std::replace(expected.begin(), expected.end(), '\n', ' ');
  EXPECT_EQ(gpt::Tokenizer(first.folder).decode(std::vector<int>(first.train.begin(), end)), expected);
  // The second load reads the cache: a missing tool would fail if it built again.
  auto again = options(dir.path);
  again.tool = "/nonexistent/gpt_tokenize";
  const auto second = gpt::load_token_streams(corpus, again);
  EXPECT_EQ(second.train, first.train);
  EXPECT_EQ(second.folder, first.folder);
  // Another vocabulary size is another entry.
  EXPECT_NE(gpt::cache_entry(dir.path, corpus, 151), first.folder);
  // Nothing half-built is left beside it.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(GptTokenizerCache, WaiterWithoutBuilderTimesOutNamingTheRanks) {
  cohort::testing::TempDir dir("cohort-gpt-cache");
  auto o = options(dir.path);
  o.build = false;
  o.build_timeout_s = 0.2;
  o.rank = 3;
  o.builder_rank = 2;
  try {
    gpt::load_token_streams(small_corpus(), o);
    FAIL() << "no error";
  } catch (const cohort::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 waited"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("local rank 0 (rank 2)"), std::string::npos) << e.what();
    EXPECT_EQ(e.missing_ranks(), std::vector<int>{2});
  }
}

TEST(GptTokenizerCache, MissingToolSaysHowToBuildIt) {
  cohort::testing::TempDir dir("cohort-gpt-cache");
  auto o = options(dir.path);
  o.tool = "/nonexistent/gpt_tokenize";
  try {
    gpt::load_token_streams(small_corpus(), o);
    FAIL() << "no error";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--target gpt_tokenize"), std::string::npos) << e.what();
  }
}

// A damaged cache entry is refused when it is loaded, naming the entry and the fix:
// before, a cut meta.json gave nlohmann's bare parse error, a missing tokenizer.vocab
// was found only when sampling after training, and ids outside the vocabulary
// trained on (Note [Ids outside the vocabulary] in tensor_parallel/vocab_range.h).
TEST(GptTokenizerCache, DamagedEntriesAreRefusedOnLoadNamingTheFix) {
  cohort::testing::TempDir dir("cohort-gpt-cache");
  const auto corpus = small_corpus();
  const auto good = gpt::load_token_streams(corpus, options(dir.path));
  const fs::path entry = good.folder;
  const auto refusal = [&]() -> std::string {
    try {
      gpt::load_token_streams(corpus, options(dir.path));
    } catch (const cohort::DataError& e) {
      return e.what();
    }
    return "no error";
  };
  const auto expect_names_fix = [&](const std::string& what, const std::string& detail) {
    EXPECT_NE(what.find("gpt: the tokenizer cache " + entry.string() + " is damaged"), std::string::npos) << what;
    EXPECT_NE(what.find("delete that folder and run again"), std::string::npos) << what;
    EXPECT_NE(what.find(detail), std::string::npos) << what;
  };

  // Out-of-range ids: 100000 in val.bin (a stream of the same length).
  auto val = good.validation;
  val.at(5) = 100000;
  gpt::write_tokens((entry / "val.bin").string(), val);
  expect_names_fix(refusal(), "val.bin holds token id 100000 (at position 5), outside its vocabulary [0, 150)");
  val.at(5) = -3;
  gpt::write_tokens((entry / "val.bin").string(), val);
  expect_names_fix(refusal(), "val.bin holds token id -3 (at position 5)");
  gpt::write_tokens((entry / "val.bin").string(), good.validation);

  // meta.json cut to 20 bytes.
  const auto meta = cohort::checkpoint::read_whole_file((entry / "meta.json").string());
  cohort::checkpoint::write_file_atomically((entry / "meta.json").string(), meta.substr(0, 20));
  expect_names_fix(refusal(), (entry / "meta.json").string() + " is not valid metadata (");
  cohort::checkpoint::write_file_atomically((entry / "meta.json").string(), meta);

  // tokenizer.vocab gone: found before training, not when sampling after it.
  fs::rename(entry / "tokenizer.vocab", entry / "vocab.away");
  const auto missing = refusal();
  EXPECT_NE(missing.find("cannot read " + (entry / "tokenizer.vocab").string()), std::string::npos) << missing;
  fs::rename(entry / "vocab.away", entry / "tokenizer.vocab");

  EXPECT_EQ(gpt::load_token_streams(corpus, options(dir.path)).validation, good.validation);
}

}  // namespace
