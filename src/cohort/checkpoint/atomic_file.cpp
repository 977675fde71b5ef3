#include "cohort/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

[[noreturn]] void fail(const char* call, const std::string& path) {
  throw Error(fmt::format("{} {}: {}", call, path, std::strerror(errno)));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // close(2) can report a failed delayed write; a durable write must check it.
  int release_and_close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

void write_all(int fd, std::string_view bytes, const std::string& path) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", path);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string parent_directory(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void write_file_durably(const std::string& path, std::string_view bytes) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail("open", path);
  write_all(fd.get(), bytes, path);
  if (::fsync(fd.get()) != 0) fail("fsync", path);
  if (fd.release_and_close() != 0) fail("close", path);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string dir = parent_directory(path);
  const std::string temp =
      fmt::format("{}/{}{}.{}", dir, kTempPrefix, base_name(path), static_cast<long>(::getpid()));
  try {
    write_file_durably(temp, bytes);
    if (::rename(temp.c_str(), path.c_str()) != 0) fail("rename", temp + " to " + path);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  fsync_directory(dir);
}

void fsync_directory(const std::string& directory) {
  Fd fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) fail("open", directory);
  if (::fsync(fd.get()) != 0) fail("fsync", directory);
}

std::string read_whole_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw DataError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  }
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    }
    if (n == 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  return out;
}

std::uint32_t crc32_of(std::string_view bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = ::crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace cohort::checkpoint
