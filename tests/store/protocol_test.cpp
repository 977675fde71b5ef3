// The store protocol's pure pieces, without sockets: the handshake's proofs, the
// sealed frames, and the encoding of requests and replies.
#include <gtest/gtest.h>

#include "cohort/store/frame_cipher.h"
#include "cohort/store/handshake.h"
#include "cohort/store/table.h"
#include "cohort/store/wire.h"

namespace {
namespace hs = cohort::store::handshake;
using cohort::store::Bytes;
using cohort::store::FrameOpener;
using cohort::store::FrameSealer;
using cohort::store::Op;
using cohort::store::Request;

Bytes bytes(const std::string& s) { return {s.begin(), s.end()}; }

bool contains(const Bytes& haystack, const std::string& needle) {
  return std::string(haystack.begin(), haystack.end()).find(needle) != std::string::npos;
}

TEST(StoreHandshake, OnlyTheTokenHolderPassesAndTheTokenIsNeverSent) {
  auto ns = hs::random_nonce();
  auto nc = hs::random_nonce();
  EXPECT_NE(ns, nc);
  auto server_hello = hs::server_hello(ns);
  EXPECT_EQ(hs::parse_server_hello(server_hello), ns);
  auto hello = hs::client_hello("token-a", ns, nc);
  ASSERT_EQ(hello.size(), hs::kClientHelloSize);
  EXPECT_FALSE(contains(hello, "token-a"));
  Bytes seen;
  EXPECT_EQ(hs::check_client_hello("token-a", ns, hello, seen), hs::HelloCheck::kAccepted);
  EXPECT_EQ(seen, nc);
  EXPECT_EQ(hs::check_client_hello("token-b", ns, hello, seen), hs::HelloCheck::kWrongToken);
  // A recorded hello is useless against a fresh server nonce.
  EXPECT_EQ(hs::check_client_hello("token-a", hs::random_nonce(), hello, seen), hs::HelloCheck::kWrongToken);
  auto garbage = bytes(std::string(hs::kClientHelloSize, 'x'));
  EXPECT_EQ(hs::check_client_hello("token-a", ns, garbage, seen), hs::HelloCheck::kNotCohort);
  EXPECT_FALSE(hs::plausible_client_hello(garbage.data(), 1));
  EXPECT_TRUE(hs::plausible_client_hello(hello.data(), 2));
  auto versioned = hello;
  versioned[hs::kMagicSize] = hs::kVersion + 1;
  EXPECT_EQ(hs::check_client_hello("token-a", ns, versioned, seen), hs::HelloCheck::kWrongVersion);

  auto proof = hs::server_proof("token-a", ns, nc);
  EXPECT_TRUE(hs::check_server_proof("token-a", ns, nc, proof));
  EXPECT_FALSE(hs::check_server_proof("token-b", ns, nc, proof));
  // The client's proof cannot be reflected back as the server's.
  Bytes client_proof(hello.end() - hs::kMacSize, hello.end());
  EXPECT_FALSE(hs::check_server_proof("token-a", ns, nc, client_proof));

  auto keys = hs::session_keys("token-a", ns, nc);
  EXPECT_NE(keys.client_to_server, keys.server_to_client);
  EXPECT_NE(keys.client_to_server, hs::session_keys("token-a", ns, hs::random_nonce()).client_to_server);
}

TEST(StoreFrames, SealedFramesOpenOnceInOrderAndOnlyIntact) {
  auto key = hs::random_nonce();
  FrameSealer sealer(key);
  FrameOpener opener(key);
  auto first = sealer.seal(bytes("first value"));
  auto second = sealer.seal(bytes("first value"));
  EXPECT_FALSE(contains(first, "first value"));
  EXPECT_NE(first, second) << "the same payload sealed twice must differ (fresh nonce)";
  ASSERT_EQ(FrameOpener::frame_size(first.data()), first.size());

  EXPECT_FALSE(opener.open(second.data(), second.size())) << "opened out of order";
  auto opened = opener.open(first.data(), first.size());
  ASSERT_TRUE(opened);
  EXPECT_EQ(*opened, bytes("first value"));
  EXPECT_FALSE(opener.open(first.data(), first.size())) << "opened a replay";

  auto tampered = second;
  tampered[cohort::store::kFrameHeaderSize] ^= 1;
  EXPECT_FALSE(opener.open(tampered.data(), tampered.size()));
  auto tampered_tag = second;
  tampered_tag.back() ^= 1;
  EXPECT_FALSE(opener.open(tampered_tag.data(), tampered_tag.size()));
  EXPECT_TRUE(opener.open(second.data(), second.size()));

  FrameOpener stranger(hs::random_nonce());
  auto third = sealer.seal({});
  EXPECT_FALSE(stranger.open(third.data(), third.size())) << "opened with another key";
  EXPECT_TRUE(opener.open(third.data(), third.size()));

  const std::uint8_t huge[4] = {0x10, 0x00, 0x00, 0x01};  // 256 MiB + 1
  EXPECT_FALSE(FrameOpener::frame_size(huge));
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
