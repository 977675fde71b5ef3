#include "cohort/launcher/keep_alive.h"

#include <fmt/format.h>

namespace cohort::launcher {

KeepAlive::KeepAlive(elastic::DynamicRendezvous& rdzv) : rdzv_(rdzv), thread_([this] { loop(); }) {}

KeepAlive::~KeepAlive() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void KeepAlive::rethrow() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw CommError(error_);
}

void KeepAlive::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    std::string failed;
    try {
      for (const auto& node : rdzv_.keep_alive())
        fmt::print(stderr, "cohort run: node {} stopped sending heartbeats; dropped from the job\n", node);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    lock.lock();
    if (!failed.empty()) {
      error_ = failed;
      return;
    }
    cv_.wait_for(lock, rdzv_.settings().keep_alive_interval(), [this] { return stop_; });
  }
}

}  // namespace cohort::launcher
