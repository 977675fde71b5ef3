#pragma once
// A Fashion-MNIST directory with the first `train` training images and the whole test
// set (or its first `test` images), in Debian's gzipped IDX layout, so that whole
// epochs of the trainer take seconds in tests. The trainer evaluates on the whole test
// set after every run, which was most of a short run's time (issue 46).
#include <filesystem>
#include <string>

#include "cohort/data/idx_file.h"
#include "support/idx_writer.h"

namespace cohort::testing {

inline std::string fashion_subset(const std::string& parent, int train, int test = 0) {
  namespace fs = std::filesystem;
  const std::string dir = parent + "/data";
  fs::create_directories(dir);
  const std::string source = "/usr/share/datasets/fashion-mnist";
  auto write = [&](const std::string& name, int items, std::vector<std::int64_t> dims, std::int64_t per_item) {
    const auto array = cohort::data::read_idx_file(source + "/" + name);
    dims.insert(dims.begin(), items);
    write_gz(dir + "/" + name, idx_bytes(dims, array.bytes.data(), static_cast<std::size_t>(items * per_item)));
  };
  write("train-images-idx3-ubyte.gz", train, {28, 28}, 28 * 28);
  write("train-labels-idx1-ubyte.gz", train, {}, 1);
  if (test > 0) {
    write("t10k-images-idx3-ubyte.gz", test, {28, 28}, 28 * 28);
    write("t10k-labels-idx1-ubyte.gz", test, {}, 1);
  } else {
    for (const char* name : {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) fs::copy(source + "/" + name, dir);
  }
  return dir;
}

}  // namespace cohort::testing
