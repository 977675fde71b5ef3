#pragma once
// Durable, all-or-nothing file writes, for checkpoints and saved weights.
//
// Note [Atomic replace]: a writer that dies at any instant (kill -9, power loss) must
// leave either the old content or the new, never a mix. So the bytes go to a temporary
// name in the same directory, are fsync'ed, are renamed over the final name (rename(2)
// is atomic within a file system), and then the directory itself is fsync'ed so that
// the rename survives a crash too. Readers ignore temporary names; the next writer
// removes the ones a dead writer left behind.
#include <cstdint>
#include <string>
#include <string_view>

namespace cohort::checkpoint {

// The prefix of temporary names; anything starting with it is a leftover, never data.
inline constexpr std::string_view kTempPrefix = ".tmp-";

// Writes `bytes` to `path` as in Note [Atomic replace]. Throws cohort::Error naming
// the path and the failing system call.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Writes a file without the rename (for files inside a directory that is itself
// renamed into place), and fsyncs it.
void write_file_durably(const std::string& path, std::string_view bytes);

// fsync(2) of a directory, making the creation, renaming or removal of its entries
// durable.
void fsync_directory(const std::string& directory);

// The whole file. Throws cohort::DataError naming the path when it cannot be read.
std::string read_whole_file(const std::string& path);

// zlib's CRC-32 of `bytes`.
std::uint32_t crc32_of(std::string_view bytes);

// The directory part of `path` ("." when it has none).
std::string parent_directory(const std::string& path);

}  // namespace cohort::checkpoint
