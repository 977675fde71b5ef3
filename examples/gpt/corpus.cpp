#include "corpus.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/errors.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

bool is_separator(const std::string& line) { return trim(line) == "%"; }

}  // namespace

std::vector<std::string> split_fortunes(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line, current;
  auto flush = [&] {
    auto t = trim(current);
    if (!t.empty()) out.push_back(std::move(t));
    current.clear();
  };
  while (std::getline(in, line)) {
    if (is_separator(line)) {
      flush();
    } else {
      current += line;
      current += '\n';
    }
  }
  flush();
  return out;
}

Corpus split_corpus(const std::vector<std::string>& fortunes, int every) {
  Corpus c;
  std::uint64_t h = fnv1a(std::to_string(every));
  for (std::size_t i = 0; i < fortunes.size(); ++i) {
    (i % static_cast<std::size_t>(every) == static_cast<std::size_t>(every - 1) ? c.validation : c.train)
        .push_back(fortunes[i]);
    h = fnv1a(fortunes[i], h);
    h = fnv1a(std::string(1, '\0'), h);  // so that ["ab"] and ["a", "b"] differ
  }
  c.hash = h;
  return c;
}

std::vector<std::string> read_fortunes(const std::string& dir) {
  const std::string fix = "install Debian's fortunes package (sudo apt-get install fortunes, or "
                          "scripts/install-deps), or point --fortunes-dir at its files";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw cohort::ConfigError(fmt::format("gpt: the corpus folder {} does not exist; {}", dir, fix));
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    // Plain files only: off/ (the offensive ones) is a folder, the *.u8 names are
    // links to the same files, *.dat are strfile's indexes.
    if (!entry.is_regular_file() || entry.is_symlink() || entry.path().has_extension()) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> fortunes;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in && !in.eof()) throw cohort::DataError(fmt::format("gpt: could not read {}", file.string()));
    for (auto& f : split_fortunes(text.str())) fortunes.push_back(std::move(f));
  }
  if (fortunes.empty())
    throw cohort::ConfigError(fmt::format("gpt: {} holds no fortune files (plain text, fortunes separated by lines "
                                          "holding %); {}", dir, fix));
  return fortunes;
}

std::uint64_t fnv1a(const std::string& bytes, std::uint64_t hash) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

}  // namespace gpt
