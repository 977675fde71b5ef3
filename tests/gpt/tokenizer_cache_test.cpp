// The tokenizer's cache (examples/gpt/tokenizer.h): built once by gpt_tokenize, read
// back, decoded, and waited for with a bound.
#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
