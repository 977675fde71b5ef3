#pragma once
// A fresh directory under /tmp for one test, removed with everything in it when the
// test ends.
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace cohort::testing {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "cohort-test") {
    std::string pattern = "/tmp/" + prefix + "-XXXXXX";
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace cohort::testing
