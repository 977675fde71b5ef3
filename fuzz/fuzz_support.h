#pragma once
// What every fuzz target shares (docs/fuzzing.md).
//
// Note [What a fuzzer counts as a finding]
// The parsers' contract is: bytes in, a value or one of cohort's documented
// exceptions (cohort::Error and its subclasses, errors.h) out. So a target runs the
// parser inside expect_cohort_errors(), which swallows cohort::Error and turns
// anything else (std::bad_alloc from a hostile length, std::out_of_range, a c10::Error
// that LibTorch threw through cohort) into an abort that libFuzzer reports, with the
// exception's type and message. Crashes, sanitizer reports, hangs (-timeout) and
// runaway memory (-rss_limit_mb, -malloc_limit_mb) are findings by themselves.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>
#include <vector>

#include <unistd.h>

#include "cohort/errors.h"

namespace cohort::fuzz {

[[noreturn]] inline void unexpected(const char* type, const char* what) {
  std::fprintf(stderr, "cohort fuzz: unexpected exception %s: %s\n", type, what);
  std::abort();
}

template <typename F>
void expect_cohort_errors(F&& f) {
  try {
    f();
  } catch (const cohort::Error&) {
    // The documented answer to bad input.
  } catch (const std::exception& e) {
    unexpected(typeid(e).name(), e.what());
  } catch (...) {
    unexpected("(not a std::exception)", "");
  }
}

// Splits `data` at `sep` bytes.
inline std::vector<std::string> split(const std::uint8_t* data, std::size_t size, char sep) {
  std::vector<std::string> parts(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (static_cast<char>(data[i]) == sep) {
      parts.emplace_back();
    } else {
      parts.back().push_back(static_cast<char>(data[i]));
    }
  }
  return parts;
}

// A private directory under $TMPDIR for the targets that read files, removed at exit.
// The fuzzers write nothing anywhere else.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/cohort-fuzz-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) {
      std::perror("cohort fuzz: mkdtemp");
      std::abort();
    }
    path_ = buf.data();
  }
  ~TempDir() { (void)std::system(("rm -rf '" + path_ + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(("cohort fuzz: writing " + path).c_str());
    std::abort();
  }
}

}  // namespace cohort::fuzz
