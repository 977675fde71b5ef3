#pragma once
// Reads IDX files, the format of MNIST and Fashion-MNIST: a magic number that gives
// the element type and the number of dimensions, the dimensions as big-endian 32-bit
// integers, then the elements. Files may be gzipped (as Debian ships them) or plain.
//
//   auto images = cohort::data::read_idx_file(".../train-images-idx3-ubyte.gz");
//   // images.dims == {60000, 28, 28}, images.bytes.size() == 60000 * 28 * 28
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::data {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;  // the elements, in file order
};

// Reads an IDX file of unsigned bytes (type 0x08). Throws cohort::DataError naming
// the file when it is missing, unreadable, truncated, has trailing bytes, fails
// gzip's CRC, or has a header that is not an unsigned-byte IDX header.
IdxArray read_idx_file(const std::string& path);

}  // namespace cohort::data
