#pragma once
// Note [Never stalled by the console]: the launcher's stdout and stderr may be pipes
// that stop being read (a paused `| less`, a log shipper that hangs, a CI runner
// busy elsewhere). A plain write(2) to such a pipe blocks once the pipe's 64 KiB
// fill, and a blocked launcher stops supervising: no heartbeats, no restarts, no
// reaping, and the store it hosts freezes with it. So `cohort run` puts a pipe of
// its own in place of each console descriptor. A reader thread empties that pipe at
// once into a bounded buffer (ConsoleBuffer); a writer thread, the only one that can
// block, carries the buffer to the real console. When the buffer is full, whole
// lines are dropped and counted, and a notice saying how many is printed once the
// console reads again. Nothing else changes for the code that prints: std::cerr,
// fmt::print and the workers' routed lines all write to descriptors 1 and 2 as
// before. Worker logs (--log-dir with --redirects or --tee) are files and keep
// every line.
//
// The relay never sets O_NONBLOCK on the console itself: that flag belongs to the
// open file description, which the shell that started us shares.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cohort::launcher {

// Bytes on their way to a console, at most `capacity` of them (a line that would
// end a partly kept line may overshoot by one byte). Pure logic, no descriptors.
class ConsoleBuffer {
 public:
  explicit ConsoleBuffer(std::size_t capacity) : capacity_(capacity) {}

  // What was written to the console. Whole lines that do not fit are dropped and
  // counted; a line begun in the buffer is ended with '\n' if its rest is dropped.
  void put(const char* data, std::size_t n);
  // Up to about `max` bytes to write next, removed from the buffer. After lines were
  // dropped, a notice saying how many comes first, as soon as there is room for it.
  std::string take(std::size_t max);
  // Whether take() would return nothing.
  bool empty() const;
  std::size_t size() const { return pending_.size(); }
  std::int64_t dropped_lines() const { return dropped_; }
  // Forgets everything held, for a console that failed for good.
  void discard() { pending_.clear(); }

 private:
  void put_segment(const char* data, std::size_t n, bool ends_line);
  std::string notice();
  std::size_t capacity_;
  std::string pending_;
  bool dropping_line_ = false;     // inside a line whose beginning was dropped
  bool open_line_ = false;         // the last byte kept did not end a line
  std::int64_t dropped_ = 0;
  std::int64_t unreported_ = 0;
};

class ConsoleRelay {
 public:
  // 8 MiB per console: minutes of a chatty job's output.
  static constexpr std::size_t kDefaultCapacity = std::size_t{8} << 20;

  // Puts a pipe in place of each descriptor of `fds` (1 and 2 for the launcher),
  // relayed to where that descriptor pointed. Throws std::system_error when a pipe,
  // dup or thread cannot be made; then nothing is changed.
  explicit ConsoleRelay(std::vector<int> fds, std::size_t capacity = kDefaultCapacity);
  // finish(kDefaultDrain) when finish() was not called; no second wait when it was.
  ~ConsoleRelay();
  ConsoleRelay(const ConsoleRelay&) = delete;
  ConsoleRelay& operator=(const ConsoleRelay&) = delete;

  static constexpr std::chrono::milliseconds kDefaultDrain{5000};
  // Puts the original descriptors back, then waits at most `drain` for what the
  // relay holds to reach the consoles. True when all of it did; false when a console
  // still does not read (what is left is dropped when the process exits).
  bool finish(std::chrono::milliseconds drain = kDefaultDrain);

  // Lines dropped so far, over every console.
  std::int64_t dropped_lines() const;

  struct Channel;  // one console: its pipe, buffer and two threads

 private:
  std::vector<std::shared_ptr<Channel>> channels_;
  bool finished_ = false;
};

}  // namespace cohort::launcher
