// The console relay (Note [Never stalled by the console]): a bounded buffer that
// drops whole lines and says how many, and the relay that keeps a writer from ever
// blocking on a console nobody reads.
#include <fcntl.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <regex>
#include <string>
#include <vector>

#include "cohort/launcher/console_relay.h"

using cohort::launcher::ConsoleBuffer;
using cohort::launcher::ConsoleRelay;

namespace {

std::string drain(ConsoleBuffer& b, std::size_t chunk = 7) {
  std::string out;
  while (!b.empty()) out += b.take(chunk);
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    auto nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

std::string numbered(int i) { return "line " + std::to_string(i) + " " + std::string(40, 'x') + "\n"; }

}  // namespace

TEST(ConsoleBuffer, KeepsEverythingThatFitsInOrder) {
  ConsoleBuffer b(1000);
  b.put("one\ntw", 6);
  b.put("o\nthree", 7);
  EXPECT_EQ(drain(b), "one\ntwo\nthree");
  EXPECT_EQ(b.dropped_lines(), 0);
}

TEST(ConsoleBuffer, DropsWholeLinesWhenFullAndSaysHowManyBeforeTheNextKeptLine) {
  ConsoleBuffer b(250);  // room for the notice (about 180 bytes) and one line
  std::string all, first_five;
  for (int i = 0; i < 10; ++i) all += numbered(i);  // 48 bytes each: five fit
  for (int i = 0; i < 5; ++i) first_five += numbered(i);
  b.put(all.data(), all.size());
  EXPECT_EQ(b.dropped_lines(), 5);
  EXPECT_EQ(b.take(1000), first_five);
  // Room again: the notice comes before anything written later.
  b.put(numbered(10).data(), numbered(10).size());
  const auto out = drain(b);
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_NE(lines[0].find("cohort run: 5 lines of output dropped here"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1] + "\n", numbered(10));
}

TEST(ConsoleBuffer, TheNoticeComesAloneWhenNothingFollows) {
  ConsoleBuffer b(50);
  const std::string two = numbered(0) + numbered(1);
  b.put(two.data(), two.size());
  EXPECT_EQ(b.take(1000), numbered(0));
  EXPECT_NE(b.take(1000).find("1 line of output dropped"), std::string::npos);
  EXPECT_TRUE(b.empty());
}

TEST(ConsoleBuffer, ALineBegunInTheBufferIsEndedWhereItsRestIsCut) {
  ConsoleBuffer b(250);
  b.put("start of a line ", 16);                  // kept, open
  const std::string rest(300, 'y');
  b.put(rest.data(), rest.size());                // does not fit: cut
  b.put(" still the same line\nnext\n", 26);      // the dropped line's end, then a new line
  const auto lines = lines_of(drain(b));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "start of a line ");
  EXPECT_NE(lines[1].find("1 line of output dropped"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[2], "next");
}

TEST(ConsoleBuffer, ALineLongerThanTheWholeBufferIsDropped) {
  ConsoleBuffer b(16);
  const std::string huge = std::string(100, 'z') + "\nok\n";
  b.put(huge.data(), huge.size());
  const auto lines = lines_of(drain(b));
  ASSERT_EQ(lines.size(), 1u);  // the notice does not fit before "ok" in 16 bytes: both wait
  EXPECT_EQ(b.dropped_lines(), 2);
  EXPECT_NE(lines[0].find("2 lines of output dropped"), std::string::npos) << lines[0];
}

// A "console" that nobody reads: a pipe whose write end sits at a spare descriptor,
// replaced by the relay like the launcher's 1 and 2.
TEST(ConsoleRelay, AWriterNeverBlocksOnAConsoleNobodyReadsAndLosesOnlyWholeLines) {
  int console[2];
  ASSERT_EQ(::pipe2(console, O_CLOEXEC), 0);
  const int fd = ::fcntl(console[1], F_DUPFD_CLOEXEC, 50);
  ::close(console[1]);
  ConsoleRelay relay({fd}, 64 * 1024);
  constexpr int kLines = 100000;  // 4.8 MB, far beyond the pipe's 64 KiB and the relay's 64 KiB
  auto writer = std::async(std::launch::async, [&] {
    for (int i = 0; i < kLines; ++i) {
      const auto line = numbered(i);
      if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return false;
    }
    return true;
  });
  const bool finished = writer.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  // Read it all (this also frees a writer that blocked, so the test ends either way).
  auto relay_done = std::async(std::launch::async, [&] {
    const bool all_out = relay.finish(std::chrono::seconds(60));
    ::close(fd);  // the console's last write end: the reader below sees its end
    return all_out;
  });
  std::string seen;
  char buf[65536];
  for (ssize_t n; (n = ::read(console[0], buf, sizeof buf)) > 0;) seen.append(buf, static_cast<std::size_t>(n));
  ::close(console[0]);
  ASSERT_TRUE(finished) << "a write blocked although the relay stood between it and the console";
  EXPECT_TRUE(writer.get());
  EXPECT_TRUE(relay_done.get());
  EXPECT_GT(relay.dropped_lines(), 0);

  // Every line seen is whole and in order, and every line written either arrived or
  // is counted in a notice.
  const std::regex kept("line (\\d+) x{40}"), note("cohort run: (\\d+) lines? of output dropped here: .*");
  long next = 0, arrived = 0, announced = 0;
  std::smatch m;
  for (const auto& line : lines_of(seen)) {
    if (std::regex_match(line, m, kept)) {
      EXPECT_GE(std::stol(m[1]), next) << line;
      next = std::stol(m[1]) + 1;
      ++arrived;
    } else if (std::regex_match(line, m, note)) {
      announced += std::stol(m[1]);
    } else {
      ADD_FAILURE() << "a cut or foreign line: " << line.substr(0, 80);
    }
  }
  EXPECT_GT(arrived, 0);
  EXPECT_GT(announced, 0);
  EXPECT_EQ(announced, relay.dropped_lines());
  EXPECT_EQ(arrived + announced, kLines);
}

// A console that stopped reading costs the launcher's exit one drain, not two: the
// relay's destructor does not wait again after finish() (the launcher's 11 s exit).
TEST(ConsoleRelay, AStalledConsoleCostsOneDrainAtExit) {
  int console[2];
  ASSERT_EQ(::pipe2(console, O_CLOEXEC), 0);
  const int fd = ::fcntl(console[1], F_DUPFD_CLOEXEC, 50);
  ::close(console[1]);
  const auto start = std::chrono::steady_clock::now();
  {
    ConsoleRelay relay({fd}, 1 << 20);
    const std::string line = numbered(2);
    for (int i = 0; i < 4000; ++i) ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
    EXPECT_FALSE(relay.finish(std::chrono::seconds(2)));  // nobody reads: the drain runs out
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 4.0) << "the relay's destructor waited again after finish()";
  EXPECT_GE(seconds, 1.9);
  // Now read: the relay's thread delivers the rest and lets go of the console.
  ::close(fd);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  char buf[65536];
  for (;;) {
    pollfd p{console[0], POLLIN, 0};
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "the relay never let go of the console";
    if (::poll(&p, 1, 1000) <= 0) continue;
    if (::read(console[0], buf, sizeof buf) <= 0) break;
  }
  ::close(console[0]);
}

TEST(ConsoleRelay, AClosedConsoleCostsTheOutputNotTheWriter) {
  auto previous = ::signal(SIGPIPE, SIG_IGN);  // as the launcher has it (agent.cpp)
  int console[2];
  ASSERT_EQ(::pipe2(console, O_CLOEXEC), 0);
  const int fd = ::fcntl(console[1], F_DUPFD_CLOEXEC, 50);
  ::close(console[1]);
  ::close(console[0]);  // the reader is gone: a write there raises SIGPIPE / EPIPE
  ConsoleRelay relay({fd}, 4096);
  const std::string line = numbered(1);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  EXPECT_FALSE(relay.finish(std::chrono::seconds(10)));  // it says the output did not arrive
  // The descriptor is the console again, as before the relay.
  errno = 0;
  EXPECT_EQ(::write(fd, "x", 1), -1);
  EXPECT_EQ(errno, EPIPE);
  ::close(fd);
  ::signal(SIGPIPE, previous);
}
