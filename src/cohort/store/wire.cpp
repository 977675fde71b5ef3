#include "cohort/store/wire.h"

#include <cstddef>

#include <c10/util/Exception.h>

namespace cohort::store {
namespace {

class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(v); }
  void u32(std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out_.push_back(static_cast<std::uint8_t>(v >> shift));
  }
  void i64(std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int shift = 56; shift >= 0; shift -= 8) out_.push_back(static_cast<std::uint8_t>(u >> shift));
  }
  template <typename Seq>
  void list(const std::vector<Seq>& items) {
    u32(static_cast<std::uint32_t>(items.size()));
    for (const auto& s : items) {
      u32(static_cast<std::uint32_t>(s.size()));
      out_.insert(out_.end(), s.begin(), s.end());
    }
  }
  Bytes take() { return std::move(out_); }

 private:
  Bytes out_;
};

// Every read checks what is left first, so a hostile count or length can neither
// read past the payload nor make us allocate more than the payload holds.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : in_(data), size_(size) {}
  bool u8(std::uint8_t& v) {
    if (left() < 1) return false;
    v = in_[pos_++];
    return true;
  }
  bool u32(std::uint32_t& v) {
    if (left() < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | in_[pos_++];
    return true;
  }
  bool i64(std::int64_t& v) {
    if (left() < 8) return false;
    std::uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | in_[pos_++];
    v = static_cast<std::int64_t>(u);
    return true;
  }
  template <typename Seq>
  bool list(std::vector<Seq>& items) {
    std::uint32_t count = 0;
    // At least 4 bytes of length per item, and at most kMaxItemsPerList items
    // (Note [Items per request]).
    if (!u32(count) || count > left() / 4 || count > kMaxItemsPerList) return false;
    items.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i) {
      std::uint32_t size = 0;
      if (!u32(size) || size > left()) return false;
      items.emplace_back(in_ + pos_, in_ + pos_ + size);
      pos_ += size;
    }
    return true;
  }
  bool done() const { return pos_ == size_; }

 private:
  std::size_t left() const { return size_ - pos_; }
  const std::uint8_t* in_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// How many keys and values each op carries; -1: any number.
struct Shape {
  int keys;
  int values;
};

std::optional<Shape> shape_of(Op op) {
  switch (op) {
    case Op::kSet: return Shape{1, 1};
    case Op::kGet: return Shape{1, 0};
    case Op::kCompareSet: return Shape{1, 2};
    case Op::kAdd: return Shape{1, 0};
    case Op::kDelete: return Shape{1, 0};
    case Op::kCheck: return Shape{-1, 0};
    case Op::kNumKeys: return Shape{0, 0};
    case Op::kWait: return Shape{-1, 0};
    case Op::kAppend: return Shape{1, 1};
    case Op::kMultiGet: return Shape{-1, 0};
    case Op::kMultiSet: return Shape{-1, -1};
    case Op::kProve: return Shape{0, 1};
  }
  return std::nullopt;
}

bool fits(int want, std::size_t have) { return want < 0 || have == static_cast<std::size_t>(want); }

}  // namespace

Bytes encode(const Request& request) {
  // The client's side of Note [Items per request]: said here, before the server
  // would drop the connection.
  TORCH_CHECK(request.keys.size() <= kMaxItemsPerList && request.values.size() <= kMaxItemsPerList, "cohort: a store ",
              op_name(request.op), " of ", request.keys.size(), " keys and ", request.values.size(),
              " values is over the store's limit of ", kMaxItemsPerList, " of each per request; name fewer keys at once");
  Writer w;
  w.u8(static_cast<std::uint8_t>(request.op));
  w.i64(request.number);
  w.list(request.keys);
  w.list(request.values);
  return w.take();
}

Bytes encode(const Reply& reply) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(reply.status));
  w.i64(reply.number);
  w.list(reply.keys);
  w.list(reply.values);
  return w.take();
}

std::optional<Request> decode_request(const Bytes& payload) { return decode_request(payload.data(), payload.size()); }

std::optional<Request> decode_request(const std::uint8_t* data, std::size_t size) {
  Reader r(data, size);
  Request out;
  std::uint8_t op = 0;
  if (!r.u8(op) || !r.i64(out.number) || !r.list(out.keys) || !r.list(out.values) || !r.done())
    return std::nullopt;
  out.op = static_cast<Op>(op);
  auto shape = op >= static_cast<std::uint8_t>(Op::kSet) && op <= static_cast<std::uint8_t>(Op::kProve)
                   ? shape_of(out.op)
                   : std::nullopt;
  if (!shape || !fits(shape->keys, out.keys.size()) || !fits(shape->values, out.values.size())) return std::nullopt;
  if (out.op == Op::kMultiSet && out.keys.size() != out.values.size()) return std::nullopt;
  return out;
}

std::optional<Reply> decode_reply(const Bytes& payload) {
  Reader r(payload.data(), payload.size());
  Reply out;
  std::uint8_t status = 0;
  if (!r.u8(status) || status > static_cast<std::uint8_t>(Status::kError) || !r.i64(out.number) ||
      !r.list(out.keys) || !r.list(out.values) || !r.done())
    return std::nullopt;
  out.status = static_cast<Status>(status);
  return out;
}

Bytes frame(const Bytes& payload) {
  TORCH_CHECK(payload.size() <= kMaxFramePayload, "cohort: a store request or reply of ", payload.size(),
              " bytes exceeds the protocol's limit of ", kMaxFramePayload, " bytes; store smaller values");
  Writer w;
  w.u32(static_cast<std::uint32_t>(payload.size()));
  Bytes out = w.take();
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::size_t framed_size(const std::uint8_t* header) {
  return (std::size_t{header[0]} << 24) | (std::size_t{header[1]} << 16) | (std::size_t{header[2]} << 8) | header[3];
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kSet: return "SET";
    case Op::kGet: return "GET";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kAdd: return "ADD";
    case Op::kDelete: return "DELETE";
    case Op::kCheck: return "CHECK";
    case Op::kNumKeys: return "NUM_KEYS";
    case Op::kWait: return "WAIT";
    case Op::kAppend: return "APPEND";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kProve: return "PROVE";
  }
  return "?";
}

}  // namespace cohort::store
