#include "cohort/launcher/worker_store.h"

#include <fmt/format.h>

#include <thread>

#include "cohort/errors.h"
#include "cohort/util/bytes.h"

namespace cohort::launcher {

RoundTcpStore::RoundTcpStore(c10::intrusive_ptr<c10d::Store> rendezvous, std::string run_id, bool hosting,
                             std::string host, std::chrono::milliseconds timeout)
    : rendezvous_(std::move(rendezvous)),
      run_id_(std::move(run_id)),
      hosting_(hosting),
      host_(std::move(host)),
      timeout_(timeout) {}

Endpoint RoundTcpStore::for_round(std::int64_t round, const std::function<void()>& check) {
  const auto key = fmt::format("/cohort/{}/round_{}/worker_tcpstore", run_id_, round);
  if (hosting_) {
    held_.reset();  // the last round's workers are gone
    held_ = compat::make_tcp_store(host_, 0, true, timeout_);
    Endpoint mine{host_, held_->getPort()};
    rendezvous_->set(key, util::to_bytes(fmt::format("{}:{}", mine.host, mine.port)));
    fmt::print(stderr, "{}\n", tcpstore_warning(mine.port));
    return mine;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!rendezvous_->check({key})) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError(fmt::format("cohort run: the agent that hosts the rendezvous published no workers' "
                                     "TCPStore for round {} within {:.0f} s (--rdzv-conf worker_store=tcpstore)\n"
                                     "  fix: see that agent's output; is it still running, and in this round?",
                                     round, std::chrono::duration<double>(timeout_).count()),
                         "workers' TCPStore", {});
    check();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return parse_endpoint(util::from_bytes(rendezvous_->get(key)), "the workers' TCPStore");
}

std::string tcpstore_warning(int port) {
  return fmt::format("cohort run: warning: worker_store=tcpstore: the workers' c10d TCPStore on port {} admits any "
                     "peer that reaches it, on every interface (as torchrun's does); run the job on a network you "
                     "trust (docs/store_security.md)",
                     port);
}

}  // namespace cohort::launcher
