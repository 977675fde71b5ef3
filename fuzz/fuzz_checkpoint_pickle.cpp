// The pickled files of a checkpoint, as a load reads them from disk: model.pt (a
// state dict, checkpoint/state_dict.h) and trainer.pt (checkpoint/trainer_state.h).
// The first byte picks which; the rest is the file. The zip reader and unpickler
// are LibTorch's; what is fuzzed here is that whatever they make of the bytes
// reaches the caller as a cohort error, and that cohort's checks of the unpickled
// value hold for any value.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include <torch/nn/modules/linear.h>

#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/trainer_state.h"
#include "fuzz_support.h"

// Note [Impossible allocations in the pickle fuzzer]
// LibTorch's unpickler allocates whatever length a string or bytes opcode announces
// (29 GB from a 1 KB file, found by this target; docs/fuzzing.md, known limits). In a
// normal process an allocation that big fails with std::bad_alloc, which
// torch_load_bytes reports as a DataError. ASan's operator new aborts instead, so this
// target replaces the global new and delete: anything over kLimit throws bad_alloc,
// as it would outside ASan; the rest goes to ASan's malloc and free, still checked.
namespace {
constexpr std::size_t kLimit = std::size_t{1} << 30;
void* allocate(std::size_t n) {
  if (n > kLimit) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace
void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return n > kLimit ? nullptr : std::malloc(n ? n : 1); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return n > kLimit ? nullptr : std::malloc(n ? n : 1); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

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
