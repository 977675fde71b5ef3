// The `.metadata` of a PyTorch distributed checkpoint (checkpoint/dcp/reader.h): a
// Python pickle read by cohort's own unpickler (Note [A pickle reader that runs
// nothing]), then DCP's fields and the tiling of each tensor's chunks checked. The
// input is the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/checkpoint/dcp/reader.h"
#include "cohort/checkpoint/dcp/unpickler.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  cohort::fuzz::expect_cohort_errors([&] {
    const auto pickle = cohort::checkpoint::dcp::unpickle(bytes, "fuzz");
    (void)pickle.root().describe();
  });
  cohort::fuzz::expect_cohort_errors([&] { (void)cohort::checkpoint::dcp::parse_metadata(bytes, "fuzz"); });
  return 0;
}
