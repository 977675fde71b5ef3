#include "cohort/comm/world.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "cohort/comm/arrival_board.h"
#include "cohort/comm/backend_factory.h"
#include "cohort/comm/rendezvous.h"
#include "cohort/errors.h"
#include "cohort/util/bytes.h"
#include "cohort/util/parse.h"

namespace cohort::comm {

struct World::State {
  WorldInfo info;
  InitOptions options;
  std::string backend;
  c10::Device device{c10::kCPU};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Store> board_store;  // a connection of its own
  mutable Group world_group;
  std::shared_ptr<Recorder> recorder;
  mutable std::mutex mu;
  mutable int groups_created = 0;
};

namespace {

constexpr auto kBoardRequestTimeout = std::chrono::seconds(10);

// `store` and `board_store` are the group's two connections, under the same prefix.
std::shared_ptr<GroupState> make_group(const World& world, const std::string& name, std::vector<int> ranks,
                                       int group_rank, const c10::intrusive_ptr<c10d::Store>& store,
                                       const c10::intrusive_ptr<c10d::Store>& board_store, const std::string& backend,
                                       const InitOptions& options) {
  auto g = std::make_shared<GroupState>();
  g->name = name;
  g->global_ranks = std::move(ranks);
  g->rank = group_rank;
  g->global_rank = world.rank();
  g->timeout = options.timeout();
  g->check_collectives = options.check_collectives();
  join(*store, "cohort/join", g->global_ranks[static_cast<size_t>(group_rank)], g->global_ranks,
       options.join_timeout());
  // The backend sees group ranks; the board and join see global ones.
  g->backend = make_backend(backend, c10::make_intrusive<c10d::PrefixStore>("backend", store), group_rank,
                            static_cast<int>(g->global_ranks.size()), world.info(), options);
  // Note [A group is made when every member is connected]
  // Gloo's mesh set-up returns on one rank before it has on another: a rank whose
  // pairs are all up may go on, fail at once (a model its options refuse) and close
  // its sockets while a peer is still finishing its own half, and that peer then
  // throws "Connection closed by peer" from its constructor instead of reaching the
  // same clear error (seen in 3 of 300 runs on a loaded machine). So each member says
  // in the store that its backend is built, and none goes on until all have: the same
  // bounded join as above, which names a member that never gets there.
  join(*store, "cohort/connected", g->global_ranks[static_cast<size_t>(group_rank)], g->global_ranks,
       options.join_timeout());
  // A rank is called silent after 3 missed beats, so the beat must be well under
  // the collective timeout for a timeout's diagnosis to be right.
  auto beat = std::max(std::min(options.heartbeat_interval(), options.timeout() / 4), std::chrono::milliseconds(100));
  g->board = std::make_unique<ArrivalBoard>(board_store, "cohort/board/", g->global_ranks, group_rank, beat);
  return g;
}

// Note [SIGPIPE in workers]
// Gloo writes to its sockets without MSG_NOSIGNAL. When a peer dies mid-collective,
// the next write to its closed connection raises SIGPIPE, whose default action
// kills the process on the spot: no exception, no error file, nothing to say that
// this rank was a casualty rather than the cause (the elastic agent once counted a
// dead node as a worker failure this way). Python ignores SIGPIPE at startup, so
// torch.distributed never meets this. A World does the same when SIGPIPE is at its
// default; a disposition the program chose is left alone. The write then fails with
// EPIPE, Gloo reports the broken pair, and the collective throws CommError.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && !(current.sa_flags & SA_SIGINFO) &&
      current.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);
}

}  // namespace

InitOptions InitOptions::from_env(const EnvMap& env) {
  InitOptions o;
  auto get = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
  };
  auto timeout = [](const std::string& text, const char* name) {
    return util::timeout_from_seconds(util::parse_seconds(text, name), name);
  };
  if (auto v = get("COHORT_BACKEND")) o.backend(*v);
  if (auto v = get("COHORT_TIMEOUT")) o.timeout(timeout(*v, "COHORT_TIMEOUT"));
  if (auto v = get("COHORT_JOIN_TIMEOUT")) o.join_timeout(timeout(*v, "COHORT_JOIN_TIMEOUT"));
  if (auto v = get("GLOO_SOCKET_IFNAME")) o.network_interface(*v);
  if (auto v = get("COHORT_CHECK_COLLECTIVES")) o.check_collectives(*v != "0");
  if (auto v = get("COHORT_GLOO_THREADS")) {
    // Digits only (std::stoi alone would take " 4" and "+4"); more than 9 digits
    // cannot be a thread count, and would overflow an int.
    const bool digits =
        v->size() <= 9 && std::all_of(v->begin(), v->end(), [](char c) { return c >= '0' && c <= '9'; });
    const int n = digits ? std::stoi(*v) : 0;
    if (n < 1)
      throw ConfigError(fmt::format("COHORT_GLOO_THREADS='{}' is not a positive whole number; unset it (4 threads) "
                                    "or give e.g. COHORT_GLOO_THREADS=2",
                                    *v));
    o.gloo_threads(n);
  }
  return o;
}

World World::init(InitOptions options) { return init(world_info_from(process_environment()), std::move(options)); }

namespace {

// `cohort run --timeline` sets COHORT_TIMELINE_DIR for every worker. A program
// whose World::init was given no recorder writes no timeline; say so once.
void warn_if_timeline_unwired(const WorldInfo& info, const InitOptions& options) {
  if (options.recorder() || info.rank != 0) return;
  const char* dir = std::getenv("COHORT_TIMELINE_DIR");
  if (!dir || !*dir) return;
  fmt::print(stderr,
             "cohort: COHORT_TIMELINE_DIR ({}) asks for a timeline, but this program's World::init was given no "
             "recorder, so none is written; pass cohort::trace::traced() to World::init "
             "(cohort/trace/world_timeline.h, docs/timeline.md)\n",
             dir);
}

}  // namespace

World World::init(const WorldInfo& info, InitOptions options) {
  options.validate();
  warn_if_timeline_unwired(info, options);
  auto store = make_world_store(info, options);
  // The board's connection is bounded like the first one: a store host busy with
  // many workers connecting may take longer than a fixed few seconds to answer.
  auto board_store = connect_again(info, store, options.join_timeout());
  // Connected; each of the board's requests is bounded far tighter than joining, so
  // a diagnosis against a frozen store host ends in seconds, not the join timeout.
  if (board_store != store) board_store->setTimeout(kBoardRequestTimeout);
  return build(info, std::move(store), std::move(board_store), std::move(options));
}

World World::init_with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size, InitOptions options) {
  WorldInfo info;
  info.rank = rank;
  info.world_size = size;
  info.local_rank = rank;
  info.local_world_size = size;
  info.local_world_size_given = true;
  auto board_store = store;
  return build(info, std::move(store), std::move(board_store), std::move(options));
}

void InitOptions::validate() const {
  auto seconds = [](std::chrono::milliseconds d) { return std::chrono::duration<double>(d).count(); };
  util::timeout_from_seconds(seconds(timeout_), "InitOptions::timeout");
  util::timeout_from_seconds(seconds(join_timeout_), "InitOptions::join_timeout");
  if (heartbeat_interval_ < std::chrono::milliseconds(100))
    throw ConfigError("InitOptions::heartbeat_interval: " + std::to_string(heartbeat_interval_.count()) +
                      " ms is under 100 ms; the board could not keep up and live ranks would look dead");
  if (gloo_threads_ < 1 || gloo_threads_ > 64)
    throw ConfigError(fmt::format("InitOptions::gloo_threads: {} is outside 1..64; 4 (the default) suits most jobs",
                                  gloo_threads_));
}

World World::build(WorldInfo info, c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<c10d::Store> board_store, InitOptions options) {
  options.validate();
  ignore_default_sigpipe();
  auto state = std::make_shared<State>();
  const auto cuda = system::detect_cuda();
  state->backend = resolve_backend(options.backend(), info.local_world_size, cuda);
  state->device = device_for_backend(state->backend, info.local_rank, cuda);
  state->info = std::move(info);
  state->options = std::move(options);
  state->store = std::move(store);
  state->board_store = std::move(board_store);
  World world(state);
  std::vector<int> all(static_cast<size_t>(state->info.world_size));
  for (int r = 0; r < state->info.world_size; ++r) all[static_cast<size_t>(r)] = r;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("cohort/world", state->store);
  auto board = c10::make_intrusive<c10d::PrefixStore>("cohort/world", state->board_store);
  auto world_group = make_group(world, "world", all, state->info.rank, prefixed, board, state->backend, state->options);
  state->world_group = Group(world_group);
  if (state->options.recorder()) {
    state->recorder = state->options.recorder()(state->world_group, state->info.rank, state->device);
    world_group->recorder = state->recorder;
  }
  return world;
}

int World::rank() const { return state_->info.rank; }
int World::size() const { return state_->info.world_size; }
int World::local_rank() const { return state_->info.local_rank; }
int World::local_size() const { return state_->info.local_world_size; }
const WorldInfo& World::info() const { return state_->info; }
const std::string& World::backend_name() const { return state_->backend; }
c10::Device World::device() const { return state_->device; }
c10::intrusive_ptr<c10d::Store> World::store() const { return state_->store; }
Group& World::group() const { return state_->world_group; }
std::shared_ptr<Recorder> World::recorder() const { return state_->recorder; }

Group World::new_group(std::vector<int> ranks) const {
  int id;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    id = ++state_->groups_created;
  }
  auto sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (ranks.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= size())
    throw ConfigError(fmt::format("cohort: new_group([{}]) on rank {}: ranks must be distinct world ranks in "
                                  "[0, {})",
                                  fmt::join(ranks, ", "), rank(), size()));
  auto me = std::find(ranks.begin(), ranks.end(), rank());
  if (me == ranks.end()) return Group();
  const int group_rank = static_cast<int>(me - ranks.begin());
  auto name = "group" + std::to_string(id);
  auto store = c10::make_intrusive<c10d::PrefixStore>("cohort/" + name, state_->store);
  // Members must agree on the rank list, or Gloo would wait for a peer that is not
  // coming. The first member publishes it and the others compare.
  auto spec = fmt::format("{}", fmt::join(ranks, ","));
  if (group_rank == 0) store->set("spec", util::to_bytes(spec));
  std::vector<uint8_t> theirs;
  try {
    store->wait({"spec"}, state_->options.join_timeout());
    theirs = store->get("spec");
  } catch (const std::exception& e) {
    throw TimeoutError(fmt::format("cohort: rank {} waited for rank {} to create {} over ranks [{}]: {}", rank(),
                                   ranks.front(), name, spec, e.what()),
                       "new_group", {ranks.front()});
  }
  if (util::from_bytes(theirs) != spec)
    throw ConfigError(fmt::format("cohort: new_group #{} differs across ranks: rank {} asked for [{}], rank {} for "
                                  "[{}]; every rank must make the same new_group calls in the same order",
                                  id, rank(), spec, ranks.front(), util::from_bytes(theirs)));
  auto board = c10::make_intrusive<c10d::PrefixStore>("cohort/" + name, state_->board_store);
  auto group = make_group(*this, name, std::move(ranks), group_rank, store, board, state_->backend, state_->options);
  group->recorder = state_->recorder;
  return Group(std::move(group));
}

}  // namespace cohort::comm
