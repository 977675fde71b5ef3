#include "cohort/comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <optional>

#include "cohort/errors.h"
#include "cohort/store/etcd_options.h"
#include "cohort/store/store_client.h"
#include "cohort/util/bytes.h"
#include "cohort/util/host.h"

namespace cohort::comm {

namespace {

// Note [A worker's etcd store]
// Under `cohort run --rdzv-backend etcd` a worker's store is the job's etcd (Note
// [Workers find etcd through their environment] in store/etcd_options.h).
// WorldInfo has no field for its options: comm/environment.h is included by nearly
// every file, and a field there would rebuild half of every tree for one
// launcher's variables. So world_info_from checks the variables (a bad one is named
// at once), and the options are read from the process's environment here, where
// the store is made. A WorldInfo made by hand never leads here unless that
// environment says COHORT_AGENT_STORE=etcd.
std::optional<store::EtcdStoreOptions> etcd_of(const WorldInfo& info) {
  if (!info.use_agent_store || info.cohort_agent_store) return std::nullopt;
  const auto env = process_environment();
  const auto it = env.find("COHORT_AGENT_STORE");
  if (it == env.end() || it->second != "etcd") return std::nullopt;
  return store::etcd_options_from_worker_env(env);
}

// A client of the store `info` names: c10d's TCPStore, the cohort agent's
// authenticated store, or the job's etcd.
c10::intrusive_ptr<c10d::Store> connect_client(const WorldInfo& info, std::chrono::milliseconds timeout) {
  if (const auto etcd = etcd_of(info)) return store::make_etcd_store(store::EtcdStoreOptions(*etcd).timeout(timeout));
  if (info.cohort_agent_store)
    return c10::make_intrusive<store::StoreClient>(info.master_addr, info.master_port, info.store_token, timeout,
                                                   info.store_certificates);
  return compat::make_tcp_store(info.master_addr, static_cast<std::uint16_t>(info.master_port), false, timeout);
}

c10::intrusive_ptr<c10d::Store> under_agent_prefix(const WorldInfo& info, c10::intrusive_ptr<c10d::Store> store) {
  if (!info.use_agent_store) return store;
  return c10::make_intrusive<c10d::PrefixStore>(info.store_prefix, std::move(store));
}

}  // namespace

c10::intrusive_ptr<c10d::Store> make_world_store(const WorldInfo& info, const InitOptions& options) {
  if (info.master_addr.empty()) {
    TORCH_INTERNAL_ASSERT(info.world_size == 1, "a multi-rank world without MASTER_ADDR passed validation");
    return c10::make_intrusive<c10d::HashStore>();
  }
  const bool server = !info.use_agent_store && info.rank == 0;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    if (server)
      store = compat::make_tcp_store(info.master_addr, static_cast<std::uint16_t>(info.master_port), true,
                                     options.join_timeout());
    else
      store = connect_client(info, options.join_timeout());
  } catch (const ConfigError&) {
    throw;  // the agent's store refused our token: say so as it is
  } catch (const std::exception& e) {
    auto seconds = std::chrono::duration<double>(options.join_timeout()).count();
    if (server)
      throw ConfigError(fmt::format("cohort: rank 0 could not listen on {}:{} for the rendezvous store: {}\n  fix: "
                                    "pick a free MASTER_PORT, or start through `cohort run`, which picks one",
                                    info.master_addr, info.master_port, e.what()));
    throw TimeoutError(
        fmt::format("cohort: rank {} could not reach the rendezvous store at {}:{} within {:.0f} s: {}\n  fix: is "
                    "{} running? check MASTER_ADDR/MASTER_PORT and that this host can reach that address",
                    info.rank, info.master_addr, info.master_port, seconds, e.what(),
                    info.use_agent_store ? "the launcher's agent" : "rank 0"),
        "connect to store", info.use_agent_store ? std::vector<int>{} : std::vector<int>{0});
  }
  store->setTimeout(options.join_timeout());
  return under_agent_prefix(info, std::move(store));
}

c10::intrusive_ptr<c10d::Store> connect_again(const WorldInfo& info, const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout) {
  if (info.master_addr.empty()) return store;
  // The first connection is up, so this one connects at once.
  return under_agent_prefix(info, connect_client(info, timeout));
}

std::vector<size_t> wait_for_keys(c10d::Store& store, const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout, const std::string& store_host) {
  try {
    store.wait(keys, timeout);
    return {};
  } catch (const std::exception&) {
    // Fall through to find out which are missing.
  }
  std::vector<size_t> missing;
  try {
    for (size_t i = 0; i < keys.size(); ++i)
      if (!store.check({keys[i]})) missing.push_back(i);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("cohort: the rendezvous store stopped answering: {}\n  fix: its host ({}) has most "
                                "likely exited; see its output",
                                e.what(), store_host));
  }
  return missing;
}

void join(c10d::Store& store, const std::string& key, int rank, const std::vector<int>& ranks,
          std::chrono::milliseconds timeout) {
  auto key_of = [&](int r) { return key + "/" + std::to_string(r); };
  auto me = util::host_name() + ":" + std::to_string(getpid());
  store.set(key_of(rank), util::to_bytes(me));
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(key_of(r));
  auto absent = wait_for_keys(store, keys, timeout, "rank 0, or the launcher");
  if (absent.empty()) return;
  std::vector<int> missing;
  for (size_t i : absent) missing.push_back(ranks[i]);
  auto seconds = std::chrono::duration<double>(timeout).count();
  throw TimeoutError(
      fmt::format("cohort: rank {} waited {:.0f} s for every rank to join '{}'; missing: rank{} {}.\n  fix: check "
                  "that those ranks started (their output, or the `cohort run` summary) and that the {} ranks "
                  "expected here were all launched; raise InitOptions::join_timeout (COHORT_JOIN_TIMEOUT) if they "
                  "start slowly",
                  rank, seconds, key, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), ranks.size()),
      "join", missing);
}

}  // namespace cohort::comm
