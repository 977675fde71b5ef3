// The store protocol's pure pieces, without sockets: frames, and the encoding of
// requests and replies.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "cohort/store/table.h"
#include "cohort/store/wire.h"

namespace {
using cohort::store::Bytes;
using cohort::store::Op;
using cohort::store::Request;

Bytes bytes(const std::string& s) { return {s.begin(), s.end()}; }

bool contains(const Bytes& haystack, const std::string& needle) {
  return std::string(haystack.begin(), haystack.end()).find(needle) != std::string::npos;
}

TEST(StoreFrames, AFrameIsALengthThenThePayloadAndOversizedOnesAreRefused) {
  auto framed = cohort::store::frame(bytes("value"));
  ASSERT_EQ(framed.size(), cohort::store::kFrameHeaderSize + 5);
  EXPECT_EQ(cohort::store::framed_size(framed.data()), 5u);
  EXPECT_TRUE(contains(framed, "value"));
  const std::uint8_t big[4] = {0x10, 0x00, 0x00, 0x01};
  EXPECT_EQ(cohort::store::framed_size(big), cohort::store::kMaxFramePayload + 1);
  EXPECT_THROW(cohort::store::frame(Bytes(cohort::store::kMaxFramePayload + 1)), c10::Error);
}

TEST(StoreWire, RequestsAndRepliesRoundTripAndBadOnesAreRejected) {
  Request set{Op::kCompareSet, -42, {"key"}, {bytes("old"), Bytes{0, 1, 2}}};
  auto decoded = cohort::store::decode_request(cohort::store::encode(set));
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->op, Op::kCompareSet);
  EXPECT_EQ(decoded->number, -42);
  EXPECT_EQ(decoded->keys, set.keys);
  EXPECT_EQ(decoded->values, set.values);

  cohort::store::Reply reply{cohort::store::Status::kTimeout, 7, {"a", "b"}, {}};
  auto back = cohort::store::decode_reply(cohort::store::encode(reply));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->status, cohort::store::Status::kTimeout);
  EXPECT_EQ(back->keys, reply.keys);

  auto encoded = cohort::store::encode(set);
  for (std::size_t cut = 0; cut < encoded.size(); ++cut)
    EXPECT_FALSE(cohort::store::decode_request(Bytes(encoded.begin(), encoded.begin() + cut))) << cut;
  // SET needs one key and one value.
  EXPECT_FALSE(cohort::store::decode_request(cohort::store::encode(Request{Op::kSet, 0, {"k"}, {}})));
  EXPECT_FALSE(cohort::store::decode_request(cohort::store::encode(Request{Op::kMultiSet, 0, {"a", "b"}, {{}}})));
  auto unknown = encoded;
  unknown[0] = 0xee;
  EXPECT_FALSE(cohort::store::decode_request(unknown));
  // A count of 2^32-1 keys in a 30-byte payload is refused, not allocated.
  Bytes hostile{static_cast<std::uint8_t>(Op::kCheck), 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
  EXPECT_FALSE(cohort::store::decode_request(hostile));
}

// Found by fuzz_store_wire: an ADD whose sum leaves int64 was undefined behaviour in
// the server. It is now an error reply and the counter keeps its value.
TEST(StoreTable, AddThatOverflowsIsAnErrorAndLeavesTheCounter) {
  cohort::store::Table table;
  auto set = table.apply(Request{Op::kAdd, INT64_MAX - 1, {"n"}, {}});
  ASSERT_TRUE(set);
  EXPECT_EQ(set->number, INT64_MAX - 1);
  for (std::int64_t delta : {std::int64_t{2}, INT64_MAX}) {
    auto r = table.apply(Request{Op::kAdd, delta, {"n"}, {}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, cohort::store::Status::kError);
    ASSERT_EQ(r->values.size(), 1u);
    EXPECT_TRUE(contains(r->values[0], "overflows")) << std::string(r->values[0].begin(), r->values[0].end());
  }
  auto low = table.apply(Request{Op::kAdd, INT64_MIN, {"m"}, {}});
  ASSERT_TRUE(low);
  auto r = table.apply(Request{Op::kAdd, -1, {"m"}, {}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, cohort::store::Status::kError);
  auto get = table.apply(Request{Op::kGet, 0, {"n"}, {}});
  ASSERT_TRUE(get);
  EXPECT_EQ(std::string(get->values.at(0).begin(), get->values.at(0).end()), std::to_string(INT64_MAX - 1));
}

}  // namespace
