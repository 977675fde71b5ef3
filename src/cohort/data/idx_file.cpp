#include "cohort/data/idx_file.h"

#include <zlib.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::data {
namespace {

constexpr std::uint8_t kUnsignedByte = 0x08;
// No IDX file in use has more than a few dimensions or more than 2^31 elements; a
// header outside these bounds is corruption, not a bigger dataset, and must not
// become a huge allocation.
constexpr int kMaxDims = 8;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 31;
// Deflate never expands data more than about 1032-fold (a run of one byte value is the
// best case), so a gzipped file of S bytes holds at most S * kMaxGzipRatio bytes.
constexpr std::int64_t kMaxGzipRatio = 1032;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

std::string gz_error(gzFile_s* f) {
  int code = Z_OK;
  const char* text = gzerror(f, &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  return text != nullptr && *text != '\0' ? text : "unexpected end of file";
}

// Reads exactly `size` bytes or explains why not.
void read_exactly(gzFile_s* f, const std::string& path, void* out, std::size_t size,
                  const char* what) {
  auto* p = static_cast<std::uint8_t*>(out);
  std::size_t done = 0;
  while (done < size) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(size - done, 1u << 30));
    const int got = gzread(f, p + done, chunk);
    if (got < 0) {
      throw DataError(fmt::format("{}: cannot read the {}: {} (the file is corrupt; "
                                  "reinstall or download it again)",
                                  path, what, gz_error(f)));
    }
    if (got == 0) {
      throw DataError(fmt::format(
          "{}: truncated: the {} needs {} bytes but the file ends after {} (reinstall "
          "or download it again)",
          path, what, size, done));
    }
    done += static_cast<std::size_t>(got);
  }
}

// Note [Check the header before allocating]
// A header is 4 + 4 * dims bytes of claims; the file's size is a fact. A bogus header
// can announce 2^31 elements in a 16-byte file, and allocating (and zeroing) that
// before reading would cost gigabytes to find what the size already tells. So the
// announced element count is checked against the most the file can hold: its size
// less the header for a plain file, and deflate's largest expansion of its size for a
// gzipped one. Only then is the array allocated.
void check_fits(gzFile_s* f, const std::string& path, std::int64_t file_size,
                std::int64_t header_bytes, std::int64_t elements) {
  const bool plain = gzdirect(f) != 0;
  const std::int64_t most = plain ? file_size - header_bytes : file_size * kMaxGzipRatio;
  if (elements > most) {
    throw DataError(fmt::format(
        "{}: the header announces {} elements, but this {}file of {} bytes can hold at most "
        "{}; the header is corrupt (reinstall or download the file again)",
        path, elements, plain ? "" : "gzipped ", file_size, most));
  }
}

std::int64_t file_size_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  return static_cast<std::int64_t>(st.st_size);
}

}  // namespace

IdxArray read_idx_file(const std::string& path) {
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) {
    throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::uint8_t magic[4];
  read_exactly(file.get(), path, magic, sizeof magic, "header");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != kUnsignedByte || magic[3] == 0 ||
      magic[3] > kMaxDims) {
    throw DataError(fmt::format(
        "{}: not an IDX file of unsigned bytes (magic {:02x} {:02x} {:02x} {:02x}, expected "
        "00 00 08 and 1..{} dimensions); the file is corrupt or of another kind",
        path, magic[0], magic[1], magic[2], magic[3], kMaxDims));
  }
  IdxArray array;
  std::int64_t elements = 1;
  for (int d = 0; d < magic[3]; ++d) {
    std::uint8_t be[4];
    read_exactly(file.get(), path, be, sizeof be, "header");
    const std::int64_t dim = (std::int64_t{be[0]} << 24) | (be[1] << 16) | (be[2] << 8) | be[3];
    if (dim <= 0 || elements > kMaxElements / dim) {
      throw DataError(fmt::format("{}: dimension {} has the impossible size {}; the file is corrupt",
                                  path, d, dim));
    }
    elements *= dim;
    array.dims.push_back(dim);
  }
  check_fits(file.get(), path, file_size_of(path), 4 + 4 * std::int64_t{magic[3]}, elements);
  array.bytes.resize(static_cast<std::size_t>(elements));
  read_exactly(file.get(), path, array.bytes.data(), array.bytes.size(), "data");
  // Reading past the data makes zlib check the gzip trailer (CRC and length), and
  // catches a file with more data than its header announces.
  std::uint8_t extra;
  const int got = gzread(file.get(), &extra, 1);
  if (got < 0) {
    throw DataError(fmt::format("{}: the data fails gzip's check: {}; the file is corrupt "
                                "(reinstall or download it again)",
                                path, gz_error(file.get())));
  }
  if (got > 0) {
    throw DataError(fmt::format("{}: more bytes than its header announces ({} elements); the "
                                "file is corrupt",
                                path, elements));
  }
  return array;
}

}  // namespace cohort::data
