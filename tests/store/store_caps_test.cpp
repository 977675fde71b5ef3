// The store's caps on memory (Note [Store memory caps] in store/table.h): a write
// over a cap is refused with a message naming it, and leaves the table as it was.
#include <gtest/gtest.h>
#include <malloc.h>

#if defined(__SANITIZE_ADDRESS__)
#define COHORT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COHORT_UNDER_ASAN 1
#endif
#endif
#ifdef COHORT_UNDER_ASAN
#include <sanitizer/allocator_interface.h>
#endif

#include <string>
#include <vector>

#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "cohort/store/table.h"
#include "cohort/store/wire.h"
#include "cohort/util/bytes.h"

namespace {
using cohort::store::Bytes;
using cohort::store::Op;
using cohort::store::Reply;
using cohort::store::Request;
using cohort::store::Status;
using cohort::store::Table;
using cohort::store::TableOptions;

Bytes bytes(const std::string& s) { return {s.begin(), s.end()}; }
Bytes filled(std::size_t n) { return Bytes(n, 'v'); }

// The bytes the heap has handed out and not taken back (ASan replaces malloc, and
// says it its own way).
std::size_t heap_in_use() {
#ifdef COHORT_UNDER_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

std::string text(const Reply& r) {
  return r.values.empty() ? "" : std::string(r.values[0].begin(), r.values[0].end());
}

Reply apply(Table& table, Request request) {
  auto r = table.apply(request);
  EXPECT_TRUE(r) << "a write must never park";
  return r ? *r : Reply{Status::kError, 0, {}, {bytes("parked")}};
}

// Everything `keys` hold (or "-" when absent), the key count and the size: enough
// to tell that a refused write changed nothing.
std::string contents(Table& table, const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    auto r = table.apply(Request{Op::kCheck, 0, {k}, {}});
    out += k + "=";
    out += r->number != 0 ? text(*table.apply(Request{Op::kGet, 0, {k}, {}})) : "-";
    out += " ";
  }
  out += "n=" + std::to_string(table.apply(Request{Op::kNumKeys, 0, {}, {}})->number);
  out += " bytes=" + std::to_string(table.size_bytes());
  return out;
}

void expect_refused(const Reply& r, const std::string& cap, const std::string& key) {
  EXPECT_EQ(r.status, Status::kError);
  auto message = text(r);
  EXPECT_NE(message.find(cap), std::string::npos) << message;
  EXPECT_NE(message.find("'" + key + "'"), std::string::npos) << message;
}

TEST(StoreCaps, DefaultsAgreeBetweenTheServerAndItsTable) {
  cohort::store::StoreServerOptions server("token");
  EXPECT_EQ(server.max_value_bytes(), TableOptions().max_value_bytes());
  EXPECT_EQ(server.max_table_bytes(), TableOptions().max_table_bytes());
  EXPECT_EQ(TableOptions().max_value_bytes(), std::size_t{64} << 20);
  EXPECT_EQ(TableOptions().max_table_bytes(), std::size_t{1} << 30);
}

TEST(StoreCaps, ValueOverTheCapIsRefusedAndChangesNothing) {
  Table table(TableOptions().max_value_bytes(10).entry_overhead_bytes(0));
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"x"}, {bytes("small")}}).status, Status::kOk);
  const auto before = contents(table, {"x", "y"});
  EXPECT_EQ(before, "x=small y=- n=1 bytes=6");
  const auto generation = table.generation();

  auto r = apply(table, Request{Op::kSet, 0, {"x"}, {filled(11)}});
  expect_refused(r, "max_value_bytes", "x");
  EXPECT_NE(text(r).find("11 bytes"), std::string::npos) << text(r);
  EXPECT_NE(text(r).find("limit of 10 bytes per value"), std::string::npos) << text(r);
  expect_refused(apply(table, Request{Op::kSet, 0, {"y"}, {filled(11)}}), "max_value_bytes", "y");
  expect_refused(apply(table, Request{Op::kCompareSet, 0, {"x"}, {bytes("small"), filled(11)}}),
                 "max_value_bytes", "x");
  expect_refused(apply(table, Request{Op::kCompareSet, 0, {"y"}, {{}, filled(11)}}), "max_value_bytes", "y");
  EXPECT_EQ(contents(table, {"x", "y"}), before);

  // Exactly at the cap is fine; a COMPARE_SET that does not swap writes nothing.
  EXPECT_EQ(apply(table, Request{Op::kCompareSet, 0, {"x"}, {bytes("other"), filled(11)}}).status, Status::kOk);
  EXPECT_EQ(table.generation(), generation) << "a refused or failed write counted as a write";
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"y"}, {filled(10)}}).status, Status::kOk);
  EXPECT_EQ(contents(table, {"x", "y"}), "x=small y=vvvvvvvvvv n=2 bytes=17");
}

TEST(StoreCaps, AppendPastTheValueCapIsRefusedAndKeepsTheValue) {
  Table table(TableOptions().max_value_bytes(8).entry_overhead_bytes(0));
  EXPECT_EQ(apply(table, Request{Op::kAppend, 0, {"log"}, {bytes("abcde")}}).status, Status::kOk);
  auto r = apply(table, Request{Op::kAppend, 0, {"log"}, {bytes("fghi")}});
  expect_refused(r, "max_value_bytes", "log");
  EXPECT_NE(text(r).find("would be 9 bytes"), std::string::npos) << text(r);
  EXPECT_EQ(contents(table, {"log"}), "log=abcde n=1 bytes=8");
  // Nor does a refused APPEND to a missing key create it.
  expect_refused(apply(table, Request{Op::kAppend, 0, {"new"}, {filled(9)}}), "max_value_bytes", "new");
  EXPECT_EQ(contents(table, {"log", "new"}), "log=abcde new=- n=1 bytes=8");
  EXPECT_EQ(apply(table, Request{Op::kAppend, 0, {"log"}, {bytes("fgh")}}).status, Status::kOk);
  EXPECT_EQ(contents(table, {"log"}), "log=abcdefgh n=1 bytes=11");
}

TEST(StoreCaps, TableCapRefusesUntilADeleteFreesRoom) {
  Table table(TableOptions().max_table_bytes(100).entry_overhead_bytes(0));
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"a"}, {filled(59)}}).status, Status::kOk);  // 60 bytes
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"b"}, {filled(29)}}).status, Status::kOk);  // 90 bytes
  const auto before = contents(table, {"a", "b", "c"});

  auto r = apply(table, Request{Op::kSet, 0, {"c"}, {filled(10)}});  // would be 101
  expect_refused(r, "max_table_bytes", "c");
  EXPECT_NE(text(r).find("would hold 101 bytes"), std::string::npos) << text(r);
  EXPECT_NE(text(r).find("limit of 100 bytes in all"), std::string::npos) << text(r);
  expect_refused(apply(table, Request{Op::kAppend, 0, {"b"}, {filled(11)}}), "max_table_bytes", "b");
  expect_refused(apply(table, Request{Op::kCompareSet, 0, {"c"}, {{}, filled(10)}}), "max_table_bytes", "c");
  EXPECT_EQ(contents(table, {"a", "b", "c"}), before);

  // Exactly at the cap is fine.
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"c"}, {filled(9)}}).status, Status::kOk);  // 100 bytes
  expect_refused(apply(table, Request{Op::kAdd, 1, {"n"}, {}}), "max_table_bytes", "n");
  EXPECT_EQ(apply(table, Request{Op::kDelete, 0, {"c"}, {}}).number, 1);
  EXPECT_EQ(table.size_bytes(), 90u);

  EXPECT_EQ(apply(table, Request{Op::kDelete, 0, {"b"}, {}}).number, 1);
  EXPECT_EQ(table.size_bytes(), 60u);
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"c"}, {filled(10)}}).status, Status::kOk);
  EXPECT_EQ(contents(table, {"a", "b", "c"}), "a=" + std::string(59, 'v') + " b=- c=vvvvvvvvvv n=2 bytes=71");
}

TEST(StoreCaps, MultiSetPartlyOverACapChangesNothing) {
  Table table(TableOptions().max_value_bytes(20).max_table_bytes(50).entry_overhead_bytes(0));
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"a"}, {bytes("old")}}).status, Status::kOk);
  const auto before = contents(table, {"a", "b", "c", "d"});
  // The second value is over the value cap: the first must not be written either.
  expect_refused(apply(table, Request{Op::kMultiSet, 0, {"a", "b"}, {bytes("new"), filled(21)}}),
                 "max_value_bytes", "b");
  EXPECT_EQ(contents(table, {"a", "b", "c", "d"}), before);
  // Each value fits, but together they are over the table cap (4 + 21 + 21 + 21 > 50).
  auto r = apply(table, Request{Op::kMultiSet, 0, {"a", "b", "c", "d"},
                                {bytes("new"), filled(20), filled(20), filled(20)}});
  expect_refused(r, "max_table_bytes", "a");
  EXPECT_NE(text(r).find("would hold 67 bytes"), std::string::npos) << text(r);
  EXPECT_EQ(contents(table, {"a", "b", "c", "d"}), before);
  // A key given twice counts once, with its last value: 4 + 21 + 21 = 46.
  EXPECT_EQ(apply(table, Request{Op::kMultiSet, 0, {"b", "a", "b", "c"},
                                 {filled(20), bytes("new"), filled(20), filled(20)}})
                .status,
            Status::kOk);
  EXPECT_EQ(table.size_bytes(), 46u);
  EXPECT_EQ(contents(table, {"a"}), "a=new n=3 bytes=46");
}

TEST(StoreCaps, EveryWriteKeepsTheSizeExact) {
  Table table(TableOptions().max_table_bytes(30).entry_overhead_bytes(0));
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"k"}, {filled(25)}}).status, Status::kOk);
  EXPECT_EQ(table.size_bytes(), 26u);
  // A shorter overwrite frees room that a new key can then use.
  expect_refused(apply(table, Request{Op::kSet, 0, {"j"}, {filled(4)}}), "max_table_bytes", "j");
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"k"}, {filled(5)}}).status, Status::kOk);
  EXPECT_EQ(table.size_bytes(), 6u);
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"j"}, {filled(4)}}).status, Status::kOk);
  EXPECT_EQ(table.size_bytes(), 11u);
  EXPECT_EQ(apply(table, Request{Op::kCompareSet, 0, {"k"}, {filled(5), bytes("ab")}}).status, Status::kOk);
  EXPECT_EQ(table.size_bytes(), 8u);
  // A counter's text changes length: "9" is 1 byte, "10" is 2.
  EXPECT_EQ(apply(table, Request{Op::kAdd, 9, {"n"}, {}}).number, 9);
  EXPECT_EQ(table.size_bytes(), 10u);
  EXPECT_EQ(apply(table, Request{Op::kAdd, 1, {"n"}, {}}).number, 10);
  EXPECT_EQ(table.size_bytes(), 11u);
  EXPECT_EQ(apply(table, Request{Op::kAdd, -20, {"n"}, {}}).number, -10);  // "-10"
  EXPECT_EQ(table.size_bytes(), 12u);
  EXPECT_EQ(apply(table, Request{Op::kAppend, 0, {"k"}, {bytes("cd")}}).status, Status::kOk);
  EXPECT_EQ(table.size_bytes(), 14u);
  EXPECT_EQ(apply(table, Request{Op::kMultiSet, 0, {"j", "m"}, {bytes("x"), bytes("yz")}}).status, Status::kOk);
  EXPECT_EQ(table.size_bytes(), 14u - 4u + 1u + 3u);
  EXPECT_EQ(apply(table, Request{Op::kDelete, 0, {"missing"}, {}}).number, 0);
  EXPECT_EQ(table.size_bytes(), 14u);
  for (const char* k : {"k", "j", "n", "m"}) EXPECT_EQ(apply(table, Request{Op::kDelete, 0, {k}, {}}).number, 1);
  EXPECT_EQ(contents(table, {"k", "j", "n", "m"}), "k=- j=- n=- m=- n=0 bytes=0");
}

TEST(StoreCaps, ClientSeesTheServersMessageNamingTheCap) {
  using cohort::util::from_bytes;
  using cohort::util::to_bytes;
  const std::string token = "job-secret-caps-7c1e";
  cohort::store::StoreServer server(
      cohort::store::StoreServerOptions(token).max_value_bytes(16).max_table_bytes(
          64 + 3 * cohort::store::kEntryOverheadBytes));
  auto client = c10::make_intrusive<cohort::store::StoreClient>("127.0.0.1", server.port(), token,
                                                                std::chrono::seconds(10));
  auto expect_throws = [](auto write, const std::string& cap) {
    try {
      write();
      ADD_FAILURE() << "a write over " << cap << " succeeded";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(cap), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'big'"), std::string::npos) << e.what();
    }
  };
  expect_throws([&] { client->set("big", std::vector<std::uint8_t>(17, 'v')); }, "max_value_bytes");
  client->set("a", std::vector<std::uint8_t>(16, 'v'));
  client->set("b", std::vector<std::uint8_t>(16, 'v'));
  client->set("c", std::vector<std::uint8_t>(16, 'v'));  // 51 bytes and 3 keys' overhead
  expect_throws([&] { client->set("big", std::vector<std::uint8_t>(16, 'v')); }, "max_table_bytes");
  // The refusals left the store as it was, and the connection usable.
  EXPECT_EQ(client->getNumKeys(), 3);
  EXPECT_FALSE(client->check({"big"}));
  EXPECT_TRUE(client->deleteKey("c"));
  client->set("big", to_bytes("fits now"));
  EXPECT_EQ(from_bytes(client->get("big")), "fits now");
}

// Note [Store memory caps]: many small keys are counted for what memory holds, not
// for their lengths alone (3 million 6-byte keys counted 18 MB and took 310 MB).
// What malloc hands out while the table takes them must stay within what it counts.
TEST(StoreCaps, ManySmallKeysAreCountedForTheMemoryTheyTake) {
  const std::size_t n = 200000;
  Table table(TableOptions().max_table_bytes(std::size_t{1} << 40));
  const auto before = heap_in_use();
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(apply(table, Request{Op::kSet, 0, {std::to_string(i)}, {bytes("v")}}).status, Status::kOk);
  const auto taken = heap_in_use() - before;
  EXPECT_GT(taken, n * 50) << "the table was expected to take far more than the keys' lengths";
  EXPECT_GE(table.size_bytes(), taken) << "counted " << table.size_bytes() << " bytes for " << taken << " taken";
  // Not wildly more either (ASan counts the bytes asked for, without malloc's headers).
  EXPECT_LE(table.size_bytes(), 3 * taken) << "counted " << table.size_bytes() << " bytes for " << taken << " taken";

  // So a cap of 1000 keys' worth holds 1000 keys, not 30 times as many (keys
  // "k1000" to "k1999", values of 1 byte).
  Table capped(TableOptions().max_table_bytes(1000 * (5 + 1 + cohort::store::kEntryOverheadBytes)));
  std::size_t stored = 0;
  while (apply(capped, Request{Op::kSet, 0, {"k" + std::to_string(1000 + stored)}, {bytes("v")}}).status == Status::kOk)
    ++stored;
  EXPECT_EQ(stored, 1000u);
}

// Note [Items per request]: a request naming more keys than the store decodes is
// refused by the client with a message, and by the server (a peer that bypassed
// the client) as malformed, before the keys are built.
TEST(StoreCaps, ARequestOfTooManyKeysIsRefusedOnBothSides) {
  const auto limit = cohort::store::kMaxItemsPerList;
  Request wait{Op::kWait, 0, std::vector<std::string>(limit + 1, ""), {}};
  try {
    cohort::store::encode(wait);
    ADD_FAILURE() << "a WAIT of " << limit + 1 << " keys was encoded";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("name fewer keys at once"), std::string::npos) << e.what();
  }
  wait.keys.pop_back();
  const auto payload = cohort::store::encode(wait);
  ASSERT_TRUE(cohort::store::decode_request(payload));
  // The same bytes with the count raised by one and one more empty key appended.
  auto over = payload;
  over[12] = static_cast<std::uint8_t>(over[12] + 1);  // op (1) + number (8), then the key count's low bytes
  over.insert(over.begin() + static_cast<std::ptrdiff_t>(payload.size()) - 4, {0, 0, 0, 0});
  EXPECT_FALSE(cohort::store::decode_request(over));
}

// Note [Replies are sized first]: one stored key named many times in a MULTI_GET is
// refused by the reply's size, summed before any value is copied (a 245-byte request
// made the server build a gigabyte), with a message that says what to do; a reply
// just under the cap is served.
TEST(StoreCaps, AMultiGetIsSizedBeforeItsReplyIsBuilt) {
  Table table(TableOptions().max_reply_bytes(1000));
  EXPECT_EQ(apply(table, Request{Op::kSet, 0, {"k"}, {filled(100)}}).status, Status::kOk);
  // 17 bytes of fields, 104 per value of 100 bytes.
  const auto nine = apply(table, Request{Op::kMultiGet, 0, std::vector<std::string>(9, "k"), {}});
  EXPECT_EQ(nine.status, Status::kOk);
  EXPECT_EQ(nine.values.size(), 9u);
  EXPECT_EQ(cohort::store::encode(nine).size(), 17u + 9 * 104);
  const auto ten = apply(table, Request{Op::kMultiGet, 0, std::vector<std::string>(10, "k"), {}});
  expect_refused(ten, "max_buffer_bytes", "k");
  EXPECT_NE(text(ten).find("MULTI_GET of keys 'k' and 9 more"), std::string::npos) << text(ten);
  EXPECT_NE(text(ten).find("fetch fewer keys at once"), std::string::npos) << text(ten);
}

}  // namespace
