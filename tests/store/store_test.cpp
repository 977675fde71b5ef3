// The store's behaviour as c10d sees it: the same answers as c10d's HashStore, gets
// that block until another client sets the key, bounded waits that name what is
// missing, and a client that fails fast and clearly when the server goes away.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <future>
#include <memory>

#include "cohort/errors.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "cohort/util/bytes.h"

namespace {
using cohort::store::StoreClient;
using cohort::store::StoreServer;
using cohort::store::StoreServerOptions;
using cohort::util::from_bytes;
using cohort::util::to_bytes;
using namespace std::chrono_literals;

const std::string kToken = "job-secret-3f9a";

c10::intrusive_ptr<StoreClient> client_of(const StoreServer& server, std::chrono::milliseconds timeout = 10s) {
  return c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), kToken, timeout);
}

// Every answer a store gives to one fixed sequence, as text.
std::vector<std::string> observe(c10d::Store& s) {
  std::vector<std::string> seen;
  auto note = [&](auto v) { seen.push_back(c10::str(v)); };
  auto b = [](const char* text) { return to_bytes(text); };
  note(s.getNumKeys());
  s.set("a", b("1"));
  note(from_bytes(s.get("a")));
  note(s.add("a", 4));
  note(s.add("n", -3));  // a missing counter starts at 0
  note(from_bytes(s.get("n")));
  note(from_bytes(s.compareSet("c", {}, b("x"))));       // missing, expected empty: swaps
  note(from_bytes(s.compareSet("c", b("x"), b("y"))));   // matches: swaps
  note(from_bytes(s.compareSet("c", b("zz"), b("w"))));  // differs: the current value
  note(from_bytes(s.compareSet("m", b("e"), b("w"))));   // missing, expected given: the expected
  note(s.check({"a", "c"}));
  note(s.check({"a", "m"}));
  note(s.getNumKeys());
  note(s.deleteKey("a"));
  note(s.deleteKey("a"));
  note(s.check({"a"}));
  note(s.getNumKeys());
  s.set("bin", std::vector<std::uint8_t>{0, 255, 10});
  auto bin = s.get("bin");
  note(std::string(bin.begin(), bin.end()) == std::string("\0\xff\n", 3));
  s.wait({"n", "c"});
  note(s.check({}));
#if COHORT_C10D_STORE_HAS_EXTENDED_API
  s.append("log", b("ab"));
  s.append("log", b("cd"));
  note(from_bytes(s.get("log")));
  s.multiSet({"x", "y"}, {b("1"), b("2")});
  auto both = s.multiGet({"y", "x"});
  note(from_bytes(both.at(0)) + from_bytes(both.at(1)));
  note(s.getNumKeys());
#endif
  return seen;
}

TEST(Store, AnswersAsHashStoreDoes) {
  StoreServer server{StoreServerOptions(kToken)};
  c10d::HashStore reference;
  auto client = client_of(server);
  EXPECT_EQ(observe(*client), observe(reference));
#if COHORT_C10D_STORE_HAS_EXTENDED_API
  EXPECT_TRUE(client->hasExtendedApi());
#endif
}

TEST(Store, AddOnTextIsAClearError) {
  StoreServer server{StoreServerOptions(kToken)};
  auto client = client_of(server);
  client->set("word", to_bytes("hello"));
  try {
    client->add("word", 1);
    FAIL() << "ADD on text succeeded";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'word'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(client->add("count", 2), 2);  // the connection is still fine
}

TEST(Store, GetBlocksUntilAnotherClientSetsTheKey) {
  StoreServer server{StoreServerOptions(kToken)};
  auto reader = client_of(server);
  auto writer = client_of(server);
  auto value = std::async(std::launch::async, [&] { return from_bytes(reader->get("late")); });
  EXPECT_EQ(value.wait_for(200ms), std::future_status::timeout) << "get returned before the key existed";
  writer->set("late", to_bytes("here"));
  ASSERT_EQ(value.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(value.get(), "here");
  auto waited = std::async(std::launch::async, [&] { reader->wait({"w1", "w2"}, 10s); });
  writer->set("w1", to_bytes("1"));
  EXPECT_EQ(waited.wait_for(200ms), std::future_status::timeout) << "wait returned with w2 missing";
  writer->add("w2", 1);
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready);
  waited.get();
}

TEST(Store, GetAndWaitTimeOutInTimeAndNameWhatIsMissing) {
  StoreServer server{StoreServerOptions(kToken)};
  auto client = client_of(server);
  client->setTimeout(300ms);
  auto start = std::chrono::steady_clock::now();
  try {
    client->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const cohort::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0.3 s"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  client->set("here", to_bytes("1"));
  try {
    client->wait({"here", "absent"}, 200ms);
    FAIL() << "wait for a missing key returned";
  } catch (const cohort::TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("'absent'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'here'"), std::string::npos) << "names a key that exists: " << what;
  }
  EXPECT_EQ(from_bytes(client->get("here")), "1");  // a timeout leaves the connection usable
}

TEST(Store, ZeroTimeoutsAreRefused) {
  StoreServer server{StoreServerOptions(kToken)};
  auto client = client_of(server);
  EXPECT_THROW(client->wait({"k"}, 0ms), cohort::ConfigError);
  EXPECT_THROW(client->setTimeout(0ms), cohort::ConfigError);
  EXPECT_THROW(StoreClient("127.0.0.1", server.port(), kToken, 0ms), cohort::ConfigError);
}

TEST(Store, ThreadsShareOneClient) {
  StoreServer server{StoreServerOptions(kToken)};
  auto client = client_of(server);
  std::vector<std::future<void>> threads;
  for (int t = 0; t < 4; ++t)
    threads.push_back(std::async(std::launch::async, [&] {
      for (int i = 0; i < 100; ++i) client->add("shared", 1);
    }));
  for (auto& t : threads) t.get();
  EXPECT_EQ(client->add("shared", 0), 400);
}

TEST(Store, ServerGoneMidWaitIsACommErrorAtOnce) {
  auto server = std::make_unique<StoreServer>(StoreServerOptions(kToken));
  auto client = client_of(*server, 60s);
  auto pending = std::async(std::launch::async, [&] { client->get("never"); });
  ASSERT_EQ(pending.wait_for(200ms), std::future_status::timeout);
  server.reset();
  // Far less than the 60 s the get may wait: closing the connection ends it.
  ASSERT_EQ(pending.wait_for(10s), std::future_status::ready);
  try {
    pending.get();
    FAIL() << "get survived the server";
  } catch (const cohort::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("closed the connection"), std::string::npos) << e.what();
  }
  EXPECT_THROW(client->set("k", to_bytes("v")), cohort::CommError);
}

TEST(Store, ClientWaitsForALateServer) {
  int port = 0;
  {
    StoreServer probe{StoreServerOptions(kToken)};  // finds a free port, then frees it
    port = probe.port();
  }
  auto connecting = std::async(std::launch::async, [&] {
    return c10::make_intrusive<StoreClient>("127.0.0.1", port, kToken, 20s);
  });
  EXPECT_EQ(connecting.wait_for(200ms), std::future_status::timeout) << "connected with nobody listening";
  StoreServer server(StoreServerOptions(kToken).port(port));
  ASSERT_EQ(connecting.wait_for(20s), std::future_status::ready);
  auto client = connecting.get();
  client->set("k", to_bytes("v"));
  EXPECT_EQ(from_bytes(client->get("k")), "v");
}

TEST(Store, NobodyListeningIsATimeoutNamingTheAddress) {
  int port = 0;
  {
    StoreServer probe{StoreServerOptions(kToken)};
    port = probe.port();
  }
  try {
    StoreClient("127.0.0.1", port, kToken, 300ms);
    FAIL() << "connected to nobody";
  } catch (const cohort::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(Store, CloneTalksToTheSameStore) {
  StoreServer server{StoreServerOptions(kToken)};
  auto client = client_of(server);
  auto other = client->clone();
  other->set("from-clone", to_bytes("1"));
  EXPECT_TRUE(client->check({"from-clone"}));
}

}  // namespace
