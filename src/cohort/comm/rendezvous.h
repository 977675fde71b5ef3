#pragma once
// How ranks find each other: the store a world uses, and the bounded join that
// makes sure every rank is present before any backend is built.
#include <chrono>
#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/comm/options.h"
#include "cohort/compat/c10d.h"

namespace cohort::comm {

// The store for `info`:
//  * a world of one with no MASTER_ADDR: an in-memory HashStore, no network;
//  * under a torchelastic agent (TORCHELASTIC_USE_AGENT_STORE): a client of the
//    agent's store, prefixed "/worker/attempt_<restart>" as torchrun's workers do;
//  * otherwise: rank 0 hosts a TCPStore at MASTER_ADDR:MASTER_PORT, the others
//    connect to it.
// Throws TimeoutError when the store cannot be reached within join_timeout.
c10::intrusive_ptr<c10d::Store> make_world_store(const WorldInfo& info, const InitOptions& options);

// A second client connection to the same store, for the arrival board (Note
// [Arrival board]); it connects within `timeout`, which also bounds its operations
// (World::init passes join_timeout, as for the first connection). For an in-memory
// world it is the same store.
c10::intrusive_ptr<c10d::Store> connect_again(const WorldInfo& info, const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout);

// Waits until every key exists. Returns the positions in `keys` still missing when
// `timeout` ran out (empty when all arrived). Throws CommError when the store stops
// answering; `store_host` names who hosts it, for the message.
std::vector<size_t> wait_for_keys(c10d::Store& store, const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout, const std::string& store_host);

// Every rank announces itself and waits for the others. Throws TimeoutError naming
// the ranks that never arrived. `key` namespaces the join (one per group or world).
void join(c10d::Store& store, const std::string& key, int rank, const std::vector<int>& ranks,
          std::chrono::milliseconds timeout);

}  // namespace cohort::comm
