#pragma once
// How a World is set up, in LibTorch's options idiom:
//
//   auto world = cohort::comm::World::init(
//       cohort::comm::InitOptions().backend("gloo").timeout(std::chrono::seconds(60)));
#include <torch/arg.h>

#include <chrono>
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/comm/recorder.h"

namespace cohort::comm {

struct InitOptions {
  // "auto" picks NCCL when this LibTorch has it and a GPU is visible, Gloo otherwise.
  TORCH_ARG(std::string, backend) = "auto";
  // Bound on every collective and point-to-point operation.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(10);
  // Bound on joining the world: reaching the store and waiting for every rank.
  TORCH_ARG(std::chrono::milliseconds, join_timeout) = std::chrono::minutes(5);
  // How often each rank publishes which collective it has reached (see
  // Note [Arrival board]); a rank silent for 3 intervals is reported as gone. At
  // least 100 ms; shortened to a quarter of `timeout` when that is smaller.
  TORCH_ARG(std::chrono::milliseconds, heartbeat_interval) = std::chrono::seconds(1);
  // Network interface for Gloo (GLOO_SOCKET_IFNAME); empty picks one.
  TORCH_ARG(std::string, network_interface) = "";
  // Records the groups' collectives and DDP's buckets (comm/recorder.h); none by
  // default. cohort::trace::traced() (trace/world_timeline.h) sets a per-rank
  // timeline here, from `cohort run --timeline` or from TimelineOptions.
  TORCH_ARG(RecorderFactory, recorder) = nullptr;
  // Note [Checked collectives]: before each group-wide collective, the ranks
  // compare what they call (operation and bytes) and throw ConfigError naming each
  // rank's call where they differ, instead of letting Gloo pair them (and abort the
  // process when the sizes differ). Costs one small all-gather per collective: a
  // debugging aid, like PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL. Set it on every rank.
  TORCH_ARG(bool, check_collectives) = false;
  // Worker threads of each Gloo group: how many of its collectives progress at
  // once. Note [Gloo threads]: DDP keeps several buckets in flight; at world 2 on
  // 2 cores, 4 threads ran DDP 8-18 % faster than 2 (PyTorch's default), and 1
  // thread 8-27 % slower (BENCHMARKS.md, issue 33). Idle threads cost nothing.
  // 1..64.
  TORCH_ARG(int, gloo_threads) = 4;

 public:  // TORCH_ARG leaves the struct in a private section.
  // Defaults overridden by COHORT_BACKEND, COHORT_TIMEOUT (seconds),
  // COHORT_JOIN_TIMEOUT (seconds), GLOO_SOCKET_IFNAME, COHORT_CHECK_COLLECTIVES
  // (1) and COHORT_GLOO_THREADS. The timeline's variables (COHORT_TIMELINE_*) are trace's: see traced().
  static InitOptions from_env(const EnvMap& env);
  // Throws ConfigError for a timeout that is not > 0 (c10d reads 0 as "never") or a
  // heartbeat too short to tell a live rank from a dead one, or gloo_threads
  // outside 1..64.
  void validate() const;
};

}  // namespace cohort::comm
