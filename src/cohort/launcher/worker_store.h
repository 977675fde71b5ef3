#pragma once
// Note [The workers' store]
// What a worker's MASTER_ADDR/MASTER_PORT lead to, by --rdzv-conf worker_store:
//  - cohort (the default): cohort's authenticated store (TLS 1.3 keyed by a token,
//    docs/store_security.md). The elastic launcher's workers use the agents' store,
//    under a prefix per round; a single-node static run hosts one of its own, bound
//    to 127.0.0.1, with a fresh token. cohort's workers (cohort::comm::World) find
//    the token in COHORT_RDZV_TOKEN. A stock c10d worker (Python's
//    init_process_group, a LibTorch program that makes its own TCPStore) cannot
//    speak it: the store closes such a connection without a byte, the worker gets an
//    error, and the launcher prints the fix once (refusals_to_stderr()).
//  - tcpstore: a plain c10d TCPStore, as torchrun gives its workers, so that stock
//    c10d workers run. Like Gloo's own traffic it is unauthenticated: anyone who
//    reaches its port may read and write its keys, and LibTorch's TCPStore listens
//    on every interface. The static launcher's agent (node 0's) hosts it for the
//    whole job. Under the elastic launcher the agent that hosts the rendezvous makes
//    a fresh one for every round, so that no key of an earlier round is seen again,
//    and publishes its address through the authenticated rendezvous
//    (RoundTcpStore); the other agents read it there.
// A static job of several nodes always shares node 0's TCPStore (torchrun's way).
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "cohort/compat/c10d.h"
#include "cohort/launcher/run_options.h"

namespace cohort::launcher {

class RoundTcpStore {
 public:
  // `rendezvous` is the agent's authenticated store; `host` is where workers reach
  // the agent that hosts it (AgentStore::host).
  RoundTcpStore(c10::intrusive_ptr<c10d::Store> rendezvous, std::string run_id, bool hosting, std::string host,
                std::chrono::milliseconds timeout);

  // The workers' TCPStore for `round`. The hosting agent makes it (dropping the last
  // round's) and publishes it; the others wait for it up to the timeout, calling
  // `check` between looks (it may throw: the agent's signals). Throws TimeoutError
  // naming the round when it is not published in time.
  Endpoint for_round(std::int64_t round, const std::function<void()>& check);

 private:
  c10::intrusive_ptr<c10d::Store> rendezvous_;
  std::string run_id_;
  bool hosting_;
  std::string host_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::TCPStore> held_;  // the hosting agent's, for the current round
};

// The warning printed once when a job's workers get a plain TCPStore on `port`.
std::string tcpstore_warning(int port);

}  // namespace cohort::launcher
