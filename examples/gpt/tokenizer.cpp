#include "tokenizer.h"

#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/errors.h"
#include "cohort/util/json_integer.h"

extern char** environ;

namespace gpt {

namespace fs = std::filesystem;

namespace {

constexpr int kFormat = 1;  // bump when the cache's contents change meaning
constexpr int kEosId = 1;   // gpt_tokenize's --eos_id

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\t', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return text;
}

// Runs `args` and waits for it, at most timeout_s, killing it then. Returns its exit
// status; throws when it cannot start or runs too long.
int run_bounded(const std::vector<std::string>& args, double timeout_s) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (const int err = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ); err != 0)
    throw cohort::ConfigError(fmt::format("gpt: cannot start {}: {}; build it (cmake --build build --target "
                                          "gpt_tokenize), which goes beside the trainer",
                                          args[0], std::strerror(err)));
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (done < 0 && errno != EINTR)
      throw cohort::Error(fmt::format("gpt: waiting for {}: {}", args[0], std::strerror(errno)));
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      throw cohort::TimeoutError(
          fmt::format("gpt: {} did not finish the tokenizer within {:.0f} s and was stopped", args[0], timeout_s),
          "build the tokenizer cache", {});
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

std::string tool_path(const TokenCacheOptions& o) {
  if (!o.tool.empty()) return o.tool;
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  return ((ec ? fs::current_path() : self.parent_path()) / "gpt_tokenize").string();
}

void write_lines(const fs::path& path, const std::vector<std::string>& fortunes) {
  std::ofstream text(path, std::ios::binary);
  for (const auto& f : fortunes) text << one_line(f) << '\n';
  text.close();
  if (!text) throw cohort::DataError(fmt::format("gpt: could not write {}", path.string()));
}

void build(const Corpus& corpus, const TokenCacheOptions& o, const std::string& entry) {
  const auto tmp = fs::path(entry).parent_path() / fmt::format("{}{}.{}", cohort::checkpoint::kTempPrefix,
                                                                fs::path(entry).filename().string(), ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_lines(tmp / "train.txt", corpus.train);
  write_lines(tmp / "val.txt", corpus.validation);
  const auto tool = tool_path(o);
  if (const int status = run_bounded({tool, tmp.string(), std::to_string(o.vocab_size)}, o.build_timeout_s);
      status != 0) {
    fs::remove_all(tmp);
    throw cohort::DataError(
        fmt::format("gpt: {} failed (exit status {}) building the tokenizer; its message is above", tool, status));
  }
  fs::remove(tmp / "train.txt");
  fs::remove(tmp / "val.txt");
  const Tokenizer pieces(tmp.string());
  const auto train = read_tokens((tmp / "train.bin").string());
  const auto validation = read_tokens((tmp / "val.bin").string());
  nlohmann::json meta = {{"format", kFormat},
                         {"vocab_size", pieces.size()},
                         {"eos_id", kEosId},
                         {"train_tokens", train.size()},
                         {"validation_tokens", validation.size()},
                         {"corpus_hash", fmt::format("{:016x}", corpus.hash)}};
  cohort::checkpoint::write_file_durably((tmp / "meta.json").string(), meta.dump(2) + "\n");
  std::error_code ec;
  fs::rename(tmp, entry, ec);
  if (ec) {
    // Another builder (a node sharing the folder) got there first: keep its copy.
    fs::remove_all(tmp);
    if (!fs::exists(fs::path(entry) / "meta.json"))
      throw cohort::DataError(fmt::format("gpt: could not move the tokenizer cache into {}: {}", entry, ec.message()));
  }
}

void wait_for(const std::string& entry, const TokenCacheOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto pause = std::chrono::milliseconds(5);
  while (!fs::exists(fs::path(entry) / "meta.json")) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited > o.build_timeout_s)
      throw cohort::TimeoutError(
          fmt::format("gpt: rank {} waited {:.0f} s for local rank 0 (rank {}) to build the tokenizer cache {}, which "
                      "did not appear; rank {}'s log says why it stopped (or, on a slow machine, build the cache once "
                      "by running the trainer alone with --steps 1)",
                      o.rank, waited, o.builder_rank, entry, o.builder_rank),
          "wait for the tokenizer cache", {o.builder_rank});
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace

std::string default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return (fs::path(xdg) / "cohort" / "gpt").string();
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return (fs::path(home) / ".cache" / "cohort" / "gpt").string();
  return (fs::current_path() / ".cache" / "cohort" / "gpt").string();
}

std::string cache_entry(const std::string& cache_dir, const Corpus& corpus, int vocab_size) {
  const auto dir = cache_dir.empty() ? default_cache_dir() : cache_dir;
  return (fs::path(dir) / fmt::format("{:016x}-v{}-f{}", corpus.hash, vocab_size, kFormat)).string();
}

TokenStreams load_token_streams(const Corpus& corpus, const TokenCacheOptions& o) {
  const auto entry = cache_entry(o.cache_dir, corpus, o.vocab_size);
  if (!fs::exists(fs::path(entry) / "meta.json")) {
    if (o.build) {
      std::error_code ec;
      fs::create_directories(fs::path(entry).parent_path(), ec);
      if (ec)
        throw cohort::ConfigError(fmt::format("gpt: cannot create the cache folder {}: {}; choose another with "
                                              "--cache-dir",
                                              fs::path(entry).parent_path().string(), ec.message()));
      build(corpus, o, entry);
    } else {
      wait_for(entry, o);
    }
  }
  TokenStreams out;
  out.folder = entry;
  const auto damaged = [&](const std::string& what) {
    return cohort::DataError(fmt::format("gpt: the tokenizer cache {} is damaged: {}; delete that folder and run "
                                         "again (the trainer builds it anew)",
                                         entry, what));
  };
  const auto meta_path = (fs::path(entry) / "meta.json").string();
  std::size_t train_tokens = 0, validation_tokens = 0;
  try {
    const auto meta = nlohmann::json::parse(cohort::checkpoint::read_whole_file(meta_path));
    out.vocab_size = cohort::util::json_integer_at<int>(meta, "vocab_size");
    out.eos_id = cohort::util::json_integer_at<int>(meta, "eos_id");
    train_tokens = cohort::util::json_integer_at<std::size_t>(meta, "train_tokens");
    validation_tokens = cohort::util::json_integer_at<std::size_t>(meta, "validation_tokens");
  } catch (const nlohmann::json::exception& e) {
    throw damaged(fmt::format("{} is not valid metadata ({})", meta_path, one_line(e.what())));
  }
  // The pieces that sampling decodes with: missing, they would be found only after
  // training.
  const Tokenizer pieces(entry);
  if (pieces.size() != out.vocab_size)
    throw damaged(fmt::format("tokenizer.vocab holds {} pieces and meta.json says {}", pieces.size(), out.vocab_size));
  out.train = read_tokens((fs::path(entry) / "train.bin").string());
  out.validation = read_tokens((fs::path(entry) / "val.bin").string());
  if (out.train.size() != train_tokens || out.validation.size() != validation_tokens)
    throw damaged("its token counts do not match meta.json");
  // Note [Ids outside the vocabulary] (src/cohort/tensor_parallel/vocab_range.h):
  // checked here once, so that the steps need no check that waits for the device.
  for (const auto* stream : {&out.train, &out.validation}) {
    const auto bad = std::find_if(stream->begin(), stream->end(), [&](std::int32_t id) {
      return id < 0 || id >= out.vocab_size;
    });
    if (bad != stream->end())
      throw damaged(fmt::format("{} holds token id {} (at position {}), outside its vocabulary [0, {}); a cache made "
                                "with another tokenizer or vocabulary size, or a corrupt file, gives such ids",
                                stream == &out.train ? "train.bin" : "val.bin", *bad, bad - stream->begin(),
                                out.vocab_size));
  }
  return out;
}

void write_tokens(const std::string& path, const std::vector<std::int32_t>& ids) {
  std::string bytes(ids.size() * 4, '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto v = static_cast<std::uint32_t>(ids[i]);
    for (std::size_t b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  }
  cohort::checkpoint::write_file_atomically(path, bytes);
}

std::vector<std::int32_t> read_tokens(const std::string& path) {
  const auto bytes = cohort::checkpoint::read_whole_file(path);
  if (bytes.size() % 4 != 0)
    throw cohort::DataError(fmt::format("gpt: {} holds {} bytes, not whole int32 token ids; delete it and run again",
                                        path, bytes.size()));
  std::vector<std::int32_t> ids(bytes.size() / 4);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::uint32_t v = 0;
    for (std::size_t b = 0; b < 4; ++b)
      v |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i * 4 + b])) << (8 * b);
    ids[i] = static_cast<std::int32_t>(v);
  }
  return ids;
}

Tokenizer::Tokenizer(const std::string& folder) {
  const auto path = (fs::path(folder) / "tokenizer.vocab").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw cohort::DataError(fmt::format("gpt: cannot read {}; delete {} and run again", path, folder));
  std::string line;
  while (std::getline(in, line)) pieces_.push_back(line.substr(0, line.find('\t')));
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  static const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space
  std::string text;
  for (int id : ids) {
    if (id < 0 || id >= size() || id == kEosId) continue;
    const auto& piece = pieces_[static_cast<std::size_t>(id)];
    text += piece == "<unk>" ? " \xe2\x81\x87 " : piece;
  }
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += text[i++];
    }
  }
  if (!out.empty() && out.front() == ' ') out.erase(0, 1);
  return out;
}

}  // namespace gpt
