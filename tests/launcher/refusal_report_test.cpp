// Refusals by the agent's store (Note [Refusals in summary]): the first few named as
// they come, the rest counted into one line per interval, the remainder at the end.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cohort/launcher/refusal_report.h"

using cohort::launcher::RefusalReport;
using namespace std::chrono_literals;

TEST(RefusalReport, NamesTheFirstFewThenSummarisesOncePerInterval) {
  std::vector<std::string> lines;
  const auto t0 = RefusalReport::Clock::time_point{} + 1000s;
  {
    RefusalReport report([&](const std::string& l) { lines.push_back(l); }, 3, 10s);
    for (int i = 0; i < 3; ++i) report.refused("peer " + std::to_string(i) + ": a different token", t0);
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[0], "cohort run: refused a connection to the rendezvous store: peer 0: a different token");
    EXPECT_EQ(lines[2], "cohort run: refused a connection to the rendezvous store: peer 2: a different token");
    EXPECT_EQ(lines[3], "cohort run: further refusals are counted and summarised at most every 10 s");
    // A flood within one interval prints nothing.
    for (int i = 0; i < 1500; ++i) report.refused("peer flood: it does not speak cohort's store protocol", t0 + 1s);
    EXPECT_EQ(lines.size(), 4u);
    // The first refusal once the interval has passed prints the count.
    report.refused("peer late: it did not finish the handshake", t0 + 12s);
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_EQ(lines[4], "cohort run: refused 1501 more connections to the rendezvous store in the last 11 s (1504 in "
                        "all); the latest: peer late: it did not finish the handshake");
    report.refused("peer last: a different token", t0 + 13s);
    EXPECT_EQ(lines.size(), 5u);
    EXPECT_EQ(report.total(), 1505);
  }
  // What was still uncounted is printed when the store closes.
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_NE(lines[5].find("refused 1 more connection to the rendezvous store"), std::string::npos) << lines[5];
  EXPECT_NE(lines[5].find("the latest: peer last: a different token"), std::string::npos) << lines[5];
}

TEST(RefusalReport, AFewRefusalsAreEachNamedAndNothingIsAddedAtTheEnd) {
  std::vector<std::string> lines;
  {
    RefusalReport report([&](const std::string& l) { lines.push_back(l); });
    report.refused("peer a: a different token");
    report.refused("peer b: a different token");
  }
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("peer b"), std::string::npos);
}

// Note [Not TLS is not a diagnosis]: a port scan looks like a stock c10d client; the
// hint must not make the unauthenticated store the fix, and lists it last.
TEST(RefusalReport, TheNotTlsHintPutsTheAuthenticatedWaysFirst) {
  const std::string hint = cohort::launcher::kNotTlsHint;
  const auto scan = hint.find("port scan");
  const auto world = hint.find("World::init()");
  const auto client = hint.find("StoreClient");
  const auto plain = hint.find("worker_store=tcpstore");
  ASSERT_NE(scan, std::string::npos) << hint;
  ASSERT_NE(world, std::string::npos) << hint;
  ASSERT_NE(client, std::string::npos) << hint;
  ASSERT_NE(plain, std::string::npos) << hint;
  EXPECT_LT(world, plain);
  EXPECT_LT(client, plain);
  EXPECT_NE(hint.find("unauthenticated", plain), std::string::npos) << hint;
}
