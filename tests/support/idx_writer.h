#pragma once
// Writes IDX files (the MNIST format) for tests: small or damaged datasets made on
// the spot.
#include <zlib.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cohort::testing {

// The bytes of an IDX file of unsigned bytes with dimensions `dims`.
inline std::string idx_bytes(const std::vector<std::int64_t>& dims, const std::uint8_t* data, std::size_t size) {
  std::string out = {0, 0, 8, static_cast<char>(dims.size())};
  for (auto d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  out.append(reinterpret_cast<const char*>(data), size);
  return out;
}
inline std::string idx_bytes(const std::vector<std::int64_t>& dims, const std::vector<std::uint8_t>& data) {
  return idx_bytes(dims, data.data(), data.size());
}

// Writes `bytes` gzipped, as Debian ships the files.
inline void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot create " + path);
  const int written = gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  if (written != static_cast<int>(bytes.size())) throw std::runtime_error("cannot write " + path);
}

}  // namespace cohort::testing
