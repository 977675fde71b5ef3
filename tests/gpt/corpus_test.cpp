// The fortune splitter and the train/validation split (examples/gpt/corpus.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cohort/errors.h"
#include "corpus.h"
#include "support/temp_dir.h"

namespace {

TEST(GptCorpus, SplitsAtPercentLines) {
  const auto f = gpt::split_fortunes("One.\n%\nTwo lines\nof it.\n%  \n\n%\n  Three.  \n");
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], "One.");
  EXPECT_EQ(f[1], "Two lines\nof it.");
  EXPECT_EQ(f[2], "Three.");
}

TEST(GptCorpus, KeepsPercentInsideText) {
  const auto f = gpt::split_fortunes("50% off\n%\r\n100%\n");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0], "50% off");
  EXPECT_EQ(f[1], "100%");
}

TEST(GptCorpus, EveryTenthIsValidation) {
  std::vector<std::string> all;
  for (int i = 0; i < 25; ++i) all.push_back("f" + std::to_string(i));
  const auto c = gpt::split_corpus(all);
  ASSERT_EQ(c.validation.size(), 2u);
  EXPECT_EQ(c.validation[0], "f9");
  EXPECT_EQ(c.validation[1], "f19");
  EXPECT_EQ(c.train.size(), 23u);
  EXPECT_EQ(c.train[9], "f10");
  // The hash follows the fortunes and their boundaries.
  EXPECT_EQ(c.hash, gpt::split_corpus(all).hash);
  EXPECT_NE(gpt::split_corpus({"ab"}).hash, gpt::split_corpus({"a", "b"}).hash);
}

TEST(GptCorpus, ReadsPlainFilesInNameOrder) {
  cohort::testing::TempDir dir("cohort-gpt-corpus");
  namespace fs = std::filesystem;
  std::ofstream(dir.path + "/b") << "B1\n%\nB2\n";
  std::ofstream(dir.path + "/a") << "A1\n";
  std::ofstream(dir.path + "/a.dat") << "index\n";
  fs::create_directory(dir.path + "/off");
  std::ofstream(dir.path + "/off/c") << "offensive\n";
  fs::create_symlink("b", dir.path + "/b.u8");
  EXPECT_EQ(gpt::read_fortunes(dir.path), (std::vector<std::string>{"A1", "B1", "B2"}));
}

TEST(GptCorpus, MissingFolderNamesThePackage) {
  try {
    gpt::read_fortunes("/nonexistent/fortunes");
    FAIL() << "no error";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install fortunes"), std::string::npos) << e.what();
  }
}

}  // namespace
