#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cohort/elastic/error_file.h"

namespace {
namespace fs = std::filesystem;
using namespace cohort::elastic;

fs::path temp_dir() {
  char tmpl[] = "/tmp/cohort-errfile-XXXXXX";
  return mkdtemp(tmpl);
}

TEST(ErrorFile, UsesTorchelasticsLayout) {
  auto j = nlohmann::json::parse(to_json({"RuntimeError: x", "trace", 42}));
  EXPECT_EQ(j["message"]["message"], "RuntimeError: x");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], "trace");
  EXPECT_EQ(j["message"]["extraInfo"]["timestamp"], "42");
}

TEST(ErrorFile, RoundTripAndForeignFiles) {
  auto dir = temp_dir();
  auto path = (dir / "error.json").string();
  ASSERT_TRUE(write_error_file(path, {"m", "d", 7}));
  auto r = read_error_file(path);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message, "m");
  EXPECT_EQ(r->timestamp, 7);
  EXPECT_FALSE(read_error_file((dir / "absent.json").string()));
  std::ofstream(dir / "plain.json") << R"({"message": "legacy string"})";
  EXPECT_EQ(read_error_file((dir / "plain.json").string())->message, "legacy string");
  std::ofstream(dir / "junk.json") << "not json";
  EXPECT_EQ(read_error_file((dir / "junk.json").string())->message, "not json");
  fs::remove_all(dir);
}

// Note [Bounded error files]: a huge message (64 MiB crashed the agent) is read as a
// bounded prefix that says it was truncated; one just under the bound is whole.
TEST(ErrorFile, AnOversizedFileIsReadAsABoundedPrefixThatSaysSo) {
  auto dir = temp_dir();
  const auto path = (dir / "error.json").string();
  ASSERT_TRUE(write_error_file(path, {std::string(3 * kMaxErrorFileBytes, 'x'), "d", 7}));
  const auto big = read_error_file(path);
  ASSERT_TRUE(big);
  EXPECT_LT(big->message.size(), kTruncatedPrefixBytes + 1024);
  EXPECT_NE(big->message.find("truncated"), std::string::npos) << big->message.substr(0, 300);
  EXPECT_NE(big->message.find(std::to_string(fs::file_size(path)) + " bytes"), std::string::npos)
      << big->message.substr(0, 300);
  EXPECT_NE(big->message.find(R"({"message":{)"), std::string::npos) << "the file's own beginning is shown";
  const std::string fits(kMaxErrorFileBytes - 200, 'y');
  ASSERT_TRUE(write_error_file(path, {fits, "d", 7}));
  EXPECT_EQ(read_error_file(path)->message, fits);
  fs::remove_all(dir);
}

TEST(ErrorFile, RecordWritesTheFileAndReturnsOne) {
  auto dir = temp_dir();
  auto path = (dir / "error.json").string();
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  int rc = record([]() -> int { throw std::runtime_error("it broke"); });
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(rc, 1);
  auto r = read_error_file(path);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message, "std::runtime_error: it broke");
  EXPECT_GT(r->timestamp, 0);
  EXPECT_EQ(record([] { return 7; }), 7);
  fs::remove_all(dir);
}

}  // namespace
