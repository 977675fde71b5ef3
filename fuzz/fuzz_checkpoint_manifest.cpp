// MANIFEST.json of a checkpoint directory (checkpoint/manifest.h), read from disk by
// read_verified(): the input is the manifest, beside two real files it may describe.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/checkpoint/manifest.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static cohort::fuzz::TempDir dir;
  static const bool files = [] {
    const std::string model = "model bytes", trainer = "trainer bytes";
    cohort::fuzz::write_file(dir.path() + "/model.pt", reinterpret_cast<const std::uint8_t*>(model.data()),
                             model.size());
    cohort::fuzz::write_file(dir.path() + "/trainer.pt", reinterpret_cast<const std::uint8_t*>(trainer.data()),
                             trainer.size());
    return true;
  }();
  (void)files;
  cohort::fuzz::write_file(dir.path() + "/" + cohort::checkpoint::kManifestName, data, size);
  cohort::fuzz::expect_cohort_errors(
      [&] { (void)cohort::checkpoint::read_verified(dir.path(), 7, {"model.pt", "trainer.pt"}); });
  return 0;
}
