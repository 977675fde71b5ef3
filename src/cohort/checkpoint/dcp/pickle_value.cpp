#include "cohort/checkpoint/dcp/pickle_value.h"

#include <cstring>
#include <limits>

namespace cohort::checkpoint::dcp {
namespace {

template <typename T>
void little_endian(std::string& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff));
}

}  // namespace

std::string PyValue::pickle() const {
  std::string out("\x80\x02", 2);  // PROTO 2
  write(out);
  out.push_back('.');  // STOP
  return out;
}

void PyValue::write(std::string& out) const {
  switch (kind_) {
    case Kind::kNone:
      out.push_back('N');
      return;
    case Kind::kBool:
      out.push_back(int_ != 0 ? '\x88' : '\x89');  // NEWTRUE, NEWFALSE
      return;
    case Kind::kInt:
      if (int_ >= 0 && int_ < 256) {
        out.push_back('K');  // BININT1
        out.push_back(static_cast<char>(int_));
      } else if (int_ >= std::numeric_limits<std::int32_t>::min() && int_ <= std::numeric_limits<std::int32_t>::max()) {
        out.push_back('J');  // BININT, 4 bytes signed
        little_endian(out, static_cast<std::uint32_t>(static_cast<std::int32_t>(int_)));
      } else {
        out.append("\x8a\x08", 2);  // LONG1 of 8 bytes, two's complement
        little_endian(out, static_cast<std::uint64_t>(int_));
      }
      return;
    case Kind::kFloat: {
      out.push_back('G');  // BINFLOAT, big-endian
      std::uint64_t bits = 0;
      std::memcpy(&bits, &float_, sizeof bits);
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
      return;
    }
    case Kind::kString:
      out.push_back('X');  // BINUNICODE: 4-byte length, UTF-8
      little_endian(out, static_cast<std::uint32_t>(text_.size()));
      out += text_;
      return;
    case Kind::kTuple:
      if (items_.empty()) {
        out.push_back(')');
        return;
      }
      out.push_back('(');  // MARK
      for (const auto& item : items_) item.write(out);
      out.push_back('t');
      return;
    case Kind::kList:
      out.push_back(']');
      if (items_.empty()) return;
      out.push_back('(');
      for (const auto& item : items_) item.write(out);
      out.push_back('e');  // APPENDS
      return;
    case Kind::kDict:
      out.push_back('}');
      if (items_.empty()) return;
      out.push_back('(');
      for (const auto& item : items_) item.write(out);
      out.push_back('u');  // SETITEMS
      return;
    case Kind::kGlobal:
      out += "c" + text_ + "\n" + name_ + "\n";
      return;
    case Kind::kCall:
      global(text_, name_).write(out);
      tuple(items_).write(out);
      out.push_back('R');  // REDUCE
      return;
    case Kind::kObject:
      global(text_, name_).write(out);
      out.append(")\x81", 2);  // EMPTY_TUPLE, NEWOBJ
      if (!items_.empty()) {
        items_.front().write(out);
        out.push_back('b');  // BUILD
      }
      return;
  }
}

}  // namespace cohort::checkpoint::dcp
