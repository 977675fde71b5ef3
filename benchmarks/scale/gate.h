#pragma once
// A start line for the store benchmark's client threads: each arrives when its
// warm-up is done, and all start the timed part together once the main thread opens
// the gate. Every wait is bounded; a gate opened with go=false sends them home.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace cohort::bench {

class Gate {
 public:
  void arrive() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++arrived_;
    cv_.notify_all();
  }

  // True once the gate opens with go=true; false when it opens with go=false or
  // stays shut for `timeout`.
  bool wait_open(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return open_; }) && go_;
  }

  // True when `n` threads arrived within `timeout`.
  bool wait_arrivals(std::size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return arrived_ >= n; });
  }

  void open(bool go) {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    go_ = go;
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t arrived_ = 0;
  bool open_ = false;
  bool go_ = false;
};

}  // namespace cohort::bench
