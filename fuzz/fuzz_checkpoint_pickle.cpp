// The pickled files of a checkpoint, as a load reads them from disk: model.pt (a
// state dict, checkpoint/state_dict.h) and trainer.pt (checkpoint/trainer_state.h).
// The first byte picks which; the rest is the file. The zip reader and unpickler
// are LibTorch's; what is fuzzed here is that whatever they make of the bytes
// reaches the caller as a cohort error, and that cohort's checks of the unpickled
// value hold for any value.
#include <cstddef>
#include <cstdint>
#include <string>

#include <torch/nn/modules/linear.h>

#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/trainer_state.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static torch::nn::Linear model(2, 3);
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  cohort::fuzz::expect_cohort_errors([&] {
    if (data[0] % 2 == 0) {
      cohort::checkpoint::load_state_dict(*model, bytes, "fuzz/model.pt");
    } else {
      (void)cohort::checkpoint::decode_trainer_state(bytes, "fuzz/trainer.pt");
    }
  });
  return 0;
}
