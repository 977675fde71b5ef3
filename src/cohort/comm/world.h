#pragma once
// The process world: who this process is among its peers, the store they share, and
// the default group spanning all of them. There is no global instance: init() returns
// a World that you pass to whatever needs it.
//
//   int main() {
//     auto world = cohort::comm::World::init();       // reads the launcher's env
//     auto t = torch::full({1}, world.rank() + 1.0);
//     world.group().all_reduce(t);                    // 1 + 2 + ... + world.size()
//   }
//
// The same binary runs under `cohort run`, `torchrun --no-python`, `srun`, `mpirun`
// or alone (a world of one, no network); see environment.h.
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/comm/group.h"
#include "cohort/comm/options.h"

namespace cohort::comm {

class World {
 public:
  // Joins the world described by this process's environment. Blocks until every
  // rank has joined, bounded by options.join_timeout(). Every init sets SIGPIPE to
  // ignored if it is at its default, as Python does (Note [SIGPIPE in workers]).
  static World init(InitOptions options = InitOptions::from_env(process_environment()));
  static World init(const WorldInfo& info, InitOptions options);
  // Joins over a store you provide, e.g. a HashStore shared by threads in tests.
  static World init_with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                               InitOptions options = InitOptions());

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  const WorldInfo& info() const;
  const std::string& backend_name() const;
  // cuda:<local rank> with NCCL, cpu with Gloo.
  c10::Device device() const;
  c10::intrusive_ptr<c10d::Store> store() const;

  // The group of all ranks.
  Group& group() const;
  // What InitOptions::recorder made for this rank, else null; the world's groups and
  // DDP record on it. trace::timeline_of(world) gives it as a trace::Timeline.
  std::shared_ptr<Recorder> recorder() const;
  // A sub-group over `ranks` (global ranks, any order, no duplicates). Collective:
  // every rank of the world calls it with the same ranks, in the same order of
  // new_group calls. Ranks outside `ranks` get a non-member handle.
  Group new_group(std::vector<int> ranks) const;

 private:
  struct State;
  explicit World(std::shared_ptr<State> state) : state_(std::move(state)) {}
  static World build(WorldInfo info, c10::intrusive_ptr<c10d::Store> store,
                     c10::intrusive_ptr<c10d::Store> board_store, InitOptions options);
  std::shared_ptr<State> state_;
};

}  // namespace cohort::comm
