#pragma once
// A check of a pickle's stack discipline before LibTorch unpickles it (Note [Pickles
// that underflow the stack] in pickle_stack.cpp).
#include <cstddef>
#include <string>

namespace cohort::checkpoint {

// Throws DataError naming `source` when an opcode of `pickle` takes more values
// than the stack (above its last mark) holds, or a mark that is not there. Stops
// at STOP, at the end, or at an opcode it does not know (the unpickler refuses those
// itself).
void check_pickle_stack(const char* pickle, std::size_t size, const std::string& source);

}  // namespace cohort::checkpoint
