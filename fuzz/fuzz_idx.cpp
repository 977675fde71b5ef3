// IDX files (data/idx_file.h), plain or gzipped, as read_idx_file() reads them from
// disk: the input is written to a file in a private temp dir first.
#include <cstddef>
#include <cstdint>

#include "cohort/data/idx_file.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static cohort::fuzz::TempDir dir;
  const std::string path = dir.path() + "/input-idx";
  cohort::fuzz::write_file(path, data, size);
  cohort::fuzz::expect_cohort_errors([&] {
    auto array = cohort::data::read_idx_file(path);
    std::int64_t elements = 1;
    for (auto d : array.dims) elements *= d;
    if (array.dims.empty() || static_cast<std::int64_t>(array.bytes.size()) != elements) std::abort();
  });
  return 0;
}
