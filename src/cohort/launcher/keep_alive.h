#pragma once
// The elastic agent's heartbeats (Note [Elastic agent loop]): a thread of their own,
// so they go on while the agent waits in a round or watches its workers. A store
// error is kept for the main thread, which rethrows it at its next look.
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "cohort/elastic/dynamic_rendezvous.h"

namespace cohort::launcher {

class KeepAlive {
 public:
  // `rdzv` should have a store connection of its own, so that beats never queue
  // behind the main thread's requests.
  explicit KeepAlive(elastic::DynamicRendezvous& rdzv);
  ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  // Throws CommError when the store has stopped answering.
  void rethrow() const;

 private:
  void loop();

  elastic::DynamicRendezvous& rdzv_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string error_;
  std::thread thread_;  // last: it starts once the rest is ready
};

}  // namespace cohort::launcher
