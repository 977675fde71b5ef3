#include "cohort/checkpoint/pickle_stack.h"

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

// Note [Pickles that underflow the stack]
// LibTorch 1.13's unpickler takes values off its stack without checking that they
// are there: a model.pt whose pickle begins with NEWOBJ read before its stack and
// crashed the process (a SEGV found by fuzz_checkpoint_pickle, regression input
// `newobj-on-an-empty-stack`). So cohort walks the opcodes first, keeping only the
// stack's depth and its marks, and refuses a pickle that takes what is not there.
// Lengths are checked against the bytes left; values are not looked at (LibTorch
// checks those and throws).

// How an opcode moves the stack: it needs `need` values above the top mark, takes
// `pop` of them (or all of them down to the mark, with `to_mark`, and then needs
// `below_mark` values under it), and pushes `push`.
struct Effect {
  int need = 0;
  int pop = 0;
  int push = 0;
  bool to_mark = false;
  int below_mark = 0;
};

struct Cursor {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos = 0;
  bool skip(std::size_t n) {
    if (n > size - pos) return false;
    pos += n;
    return true;
  }
  bool length(int bytes, std::uint64_t& out) {  // little-endian, as pickle writes them
    if (static_cast<std::size_t>(bytes) > size - pos) return false;
    out = 0;
    for (int i = bytes - 1; i >= 0; --i) out = (out << 8) | data[pos + static_cast<std::size_t>(i)];
    pos += static_cast<std::size_t>(bytes);
    return true;
  }
  bool line() {
    while (pos < size)
      if (data[pos++] == '\n') return true;
    return false;
  }
};

}  // namespace

void check_pickle_stack(const char* pickle, std::size_t size, const std::string& source) {
  Cursor in{reinterpret_cast<const std::uint8_t*>(pickle), size};
  std::int64_t depth = 0;
  std::vector<std::int64_t> marks;
  auto refuse = [&](std::uint8_t op, std::size_t at, const std::string& what) {
    throw DataError(fmt::format("{}: its pickle is malformed at byte {} (opcode 0x{:02x}): {}; the file is corrupt",
                                source, at, op, what));
  };
  while (in.pos < in.size) {
    const std::size_t at = in.pos;
    const std::uint8_t op = in.data[in.pos++];
    Effect e;
    bool ok = true;
    std::uint64_t n = 0;
    switch (op) {
      case 0x80: ok = in.skip(1); break;                                  // PROTO
      case 0x95: ok = in.skip(8); break;                                  // FRAME
      case '.':                                                           // STOP
        if (depth - (marks.empty() ? 0 : marks.back()) < 1) refuse(op, at, "STOP with nothing to return");
        return;
      case '(': marks.push_back(depth); continue;                         // MARK
      case '0': e = {1, 1, 0}; break;                                     // POP
      case '1': e.to_mark = true; break;                                  // POP_MARK
      case '2': e = {1, 0, 1}; break;                                     // DUP
      case 'J': ok = in.skip(4); e.push = 1; break;                       // BININT
      case 'K': ok = in.skip(1); e.push = 1; break;                       // BININT1
      case 'M': ok = in.skip(2); e.push = 1; break;                       // BININT2
      case 'G': ok = in.skip(8); e.push = 1; break;                       // BINFLOAT
      case 0x8a: ok = in.length(1, n) && in.skip(n); e.push = 1; break;   // LONG1
      case 0x8b: ok = in.length(4, n) && in.skip(n); e.push = 1; break;   // LONG4
      case 'T': case 'X': case 'B':                                        // BINSTRING, BINUNICODE, BINBYTES
        ok = in.length(4, n) && in.skip(n); e.push = 1; break;
      case 'U': case 0x8c: case 'C':                                       // SHORT_BINSTRING, SHORT_BINUNICODE, SHORT_BINBYTES
        ok = in.length(1, n) && in.skip(n); e.push = 1; break;
      case 0x8d: case 0x8e:                                                // BINUNICODE8, BINBYTES8
        ok = in.length(8, n) && in.skip(n); e.push = 1; break;
      case 'N': case 0x88: case 0x89: case ')': case ']': case '}': case 0x8f:  // constants, empty containers
        e.push = 1; break;
      case 'c': ok = in.line() && in.line(); e.push = 1; break;           // GLOBAL
      case 0x93: e = {2, 2, 1}; break;                                    // STACK_GLOBAL
      case 'q': ok = in.skip(1); e.need = 1; break;                       // BINPUT
      case 'r': ok = in.skip(4); e.need = 1; break;                       // LONG_BINPUT
      case 0x94: e.need = 1; break;                                       // MEMOIZE
      case 'h': ok = in.skip(1); e.push = 1; break;                       // BINGET
      case 'j': ok = in.skip(4); e.push = 1; break;                       // LONG_BINGET
      case 't': case 'l': case 'd': e.to_mark = true; e.push = 1; break;  // TUPLE, LIST, DICT
      case 0x85: e = {1, 1, 1}; break;                                    // TUPLE1
      case 0x86: e = {2, 2, 1}; break;                                    // TUPLE2
      case 0x87: e = {3, 3, 1}; break;                                    // TUPLE3
      case 'a': e = {2, 1, 0}; break;                                     // APPEND
      case 's': e = {3, 2, 0}; break;                                     // SETITEM
      case 'e': case 'u': case 0x90:                                       // APPENDS, SETITEMS, ADDITEMS
        e.to_mark = true; e.below_mark = 1; break;
      case 'R': e = {2, 2, 1}; break;                                     // REDUCE
      case 'b': e = {2, 1, 0}; break;                                     // BUILD
      case 0x81: e = {2, 2, 1}; break;                                    // NEWOBJ
      case 0x92: e = {3, 3, 1}; break;                                    // NEWOBJ_EX
      case 'Q': e = {1, 1, 1}; break;                                     // BINPERSID
      default: return;  // not one of ours: LibTorch's unpickler refuses it
    }
    if (!ok) refuse(op, at, "its argument runs past the end of the pickle");
    if (e.to_mark) {
      if (marks.empty()) refuse(op, at, "it needs a MARK and there is none");
      const std::int64_t mark = marks.back();
      marks.pop_back();
      if (mark < e.below_mark)
        refuse(op, at, fmt::format("it needs {} value(s) below its MARK and the stack holds {}", e.below_mark, mark));
      depth = mark + e.push;
      continue;
    }
    const std::int64_t above = depth - (marks.empty() ? 0 : marks.back());
    if (above < e.need)
      refuse(op, at, fmt::format("it takes {} value(s) from a stack that holds {} above its last MARK", e.need, above));
    depth += e.push - e.pop;
  }
}

}  // namespace cohort::checkpoint
