#include "cohort/pipeline/simulator.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "cohort/errors.h"

namespace cohort::pipeline {

namespace {

// What an action waits for: one action (B or I both count as "the backward") on a rank.
struct Need {
  std::vector<Action> any_of;
  int rank;
  std::string what;  // in words, for the deadlock message
};

using Key = std::tuple<int, int, int, int>;  // rank, kind, stage, micro-batch
Key key(int rank, const Action& a) { return {rank, static_cast<int>(a.kind), a.stage, a.microbatch}; }

bool is_compute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kBackwardInput ||
         k == ActionKind::kBackwardWeight;
}

double cost(const SimulationCosts& c, ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return c.forward();
    case ActionKind::kBackward: return c.backward_input() + c.backward_weight();
    case ActionKind::kBackwardInput: return c.backward_input();
    case ActionKind::kBackwardWeight: return c.backward_weight();
    default: return 0;
  }
}

// The actions `a`, on `rank`, consumes: all must have run first.
std::vector<Need> needs(const Schedule& s, int rank, const Action& a) {
  const int last = s.stages() - 1, mb = a.microbatch;
  auto act = [&](ActionKind k, int stage) { return Action{k, stage, mb}; };
  auto backward = [&](int stage) {
    return std::vector<Action>{act(ActionKind::kBackward, stage), act(ActionKind::kBackwardInput, stage)};
  };
  std::vector<Need> out;
  switch (a.kind) {
    case ActionKind::kForward:
      if (a.stage == 0) break;
      if (s.rank_of(a.stage - 1) == rank)
        out.push_back({{act(ActionKind::kForward, a.stage - 1)}, rank, "the previous stage's forward"});
      else
        out.push_back({{act(ActionKind::kRecvActivation, a.stage)}, rank, "its input activation"});
      break;
    case ActionKind::kSendActivation:
      out.push_back({{act(ActionKind::kForward, a.stage)}, rank, "the forward whose output it sends"});
      break;
    case ActionKind::kRecvActivation:
      out.push_back({{act(ActionKind::kSendActivation, a.stage - 1)}, s.rank_of(a.stage - 1),
                     fmt::format("micro-batch {}'s activation from stage {}", mb, a.stage - 1)});
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      out.push_back({{act(ActionKind::kForward, a.stage)}, rank, "its forward"});
      if (a.stage == last) break;  // the loss is computed by the forward
      if (s.rank_of(a.stage + 1) == rank)
        out.push_back({backward(a.stage + 1), rank, "the next stage's backward"});
      else
        out.push_back({{act(ActionKind::kRecvGradient, a.stage)}, rank, "its output gradient"});
      break;
    case ActionKind::kBackwardWeight:
      out.push_back({{act(ActionKind::kBackwardInput, a.stage)}, rank, "its input-gradient pass"});
      break;
    case ActionKind::kSendGradient:
      out.push_back({backward(a.stage), rank, "the backward whose input gradient it sends"});
      break;
    case ActionKind::kRecvGradient:
      out.push_back({{act(ActionKind::kSendGradient, a.stage + 1)}, s.rank_of(a.stage + 1),
                     fmt::format("micro-batch {}'s output gradient from stage {}", mb, a.stage + 1)});
      break;
  }
  return out;
}

// Sends and receives only where the neighbouring stage lives on another rank: between
// stages of one rank the runtime hands tensors over locally.
std::string misplaced_transfer(const Schedule& s, int rank, const Action& a) {
  const int last = s.stages() - 1;
  auto remote = [&](int stage) { return stage >= 0 && stage <= last && s.rank_of(stage) != rank; };
  switch (a.kind) {
    case ActionKind::kSendActivation:
    case ActionKind::kRecvGradient: {
      const int peer = a.stage + 1;
      if (remote(peer)) return "";
      return peer > last ? fmt::format("stage {} is the last, with no stage after it", a.stage)
                         : fmt::format("stage {} after it is on the same rank", peer);
    }
    case ActionKind::kRecvActivation:
    case ActionKind::kSendGradient: {
      const int peer = a.stage - 1;
      if (remote(peer)) return "";
      return peer < 0 ? "stage 0 has no stage before it" : fmt::format("stage {} before it is on the same rank", peer);
    }
    default: return "";
  }
}

// Note [Complete lists]
// Each rank runs, for every (its stage, micro-batch), one F and either one B or one I
// and one W; every action is for a stage of its own rank; sends and receives only
// cross ranks. A missing send or receive then shows up as a wait that never ends.
void check_lists(const Schedule& s) {
  if (static_cast<int>(s.actions.size()) != s.ranks)
    throw ConfigError(fmt::format("cohort pipeline: the schedule has {} ranks but action lists for {}; give one list "
                                  "per pipeline rank",
                                  s.ranks, s.actions.size()));
  for (int r = 0; r < s.ranks; ++r) {
    std::map<std::tuple<int, int, int>, int> seen;  // kind, stage, micro-batch
    for (const auto& a : s.actions[r]) {
      if (a.stage < 0 || a.stage >= s.stages())
        throw ConfigError(fmt::format("cohort pipeline: rank {}'s action {} is for stage {}, but the schedule has "
                                      "stages 0 to {}",
                                      r, to_string(a), a.stage, s.stages() - 1));
      if (s.rank_of(a.stage) != r)
        throw ConfigError(fmt::format("cohort pipeline: rank {}'s action {} is for stage {}, which lives on rank {}; "
                                      "move it to rank {}'s list",
                                      r, to_string(a), a.stage, s.rank_of(a.stage), s.rank_of(a.stage)));
      if (a.microbatch < 0 || a.microbatch >= s.microbatches)
        throw ConfigError(fmt::format("cohort pipeline: rank {}'s action {} names micro-batch {}, but there are {} "
                                      "(0 to {})",
                                      r, to_string(a), a.microbatch, s.microbatches, s.microbatches - 1));
      const auto wrong = misplaced_transfer(s, r, a);
      if (!wrong.empty())
        throw ConfigError(fmt::format("cohort pipeline: rank {}'s action {} has no peer: {}; remove it", r,
                                      to_string(a), wrong));
      if (++seen[{static_cast<int>(a.kind), a.stage, a.microbatch}] > 1)
        throw ConfigError(fmt::format("cohort pipeline: rank {} runs {} twice; keep one", r, to_string(a)));
    }
    for (int c = 0; c < s.virtual_stages; ++c) {
      const int stage = c * s.ranks + r;
      for (int m = 0; m < s.microbatches; ++m) {
        auto has = [&](ActionKind k) { return seen.count({static_cast<int>(k), stage, m}) > 0; };
        const bool plain = has(ActionKind::kBackward);
        const bool input = has(ActionKind::kBackwardInput), weight = has(ActionKind::kBackwardWeight);
        std::string missing;
        if (!has(ActionKind::kForward)) missing = "F";
        else if (!plain && !input && !weight) missing = "B (or I and W)";
        else if (!plain && !weight) missing = "W";
        else if (!plain && !input) missing = "I";
        if (!missing.empty())
          throw ConfigError(fmt::format("cohort pipeline: rank {} never runs {} for micro-batch {} of stage {}", r,
                                        missing, m, stage));
        if (plain && (input || weight))
          throw ConfigError(fmt::format("cohort pipeline: rank {} runs both B and I/W for micro-batch {} of stage {}; "
                                        "keep either B or the pair I and W",
                                        r, m, stage));
      }
    }
  }
}

struct Run {
  const Schedule& s;
  std::map<Key, double> done;  // when each executed action's result is available
  std::vector<std::size_t> next;

  // The first need of rank r's next action that has not run, or nullptr; `ready` is
  // when all of them have.
  const Need* unmet(int r, std::vector<Need>& all, double& ready) const {
    all = needs(s, r, s.actions[r][next[r]]);
    ready = 0;
    for (const auto& n : all) {
      double best = -1;
      for (const auto& a : n.any_of) {
        auto it = done.find(key(n.rank, a));
        if (it != done.end()) best = best < 0 ? it->second : std::min(best, it->second);
      }
      if (best < 0) return &n;
      ready = std::max(ready, best);
    }
    return nullptr;
  }

  bool finished(int r) const { return next[r] >= s.actions[r].size(); }

  // "for SA0@s0 on rank 0 (micro-batch 0's activation from stage 0), which rank 0 only
  // reaches after its own wait at RG0@s0": what rank `waiter` waits for, and why it never comes.
  std::string describe_wait(int waiter, const Need& n) const {
    const auto& want = n.any_of.front();
    std::string alt;
    for (std::size_t i = 1; i < n.any_of.size(); ++i) alt += " or " + to_string(n.any_of[i]);
    std::string where;
    const auto& list = s.actions[n.rank];
    auto pos = list.end();
    for (const auto& a : n.any_of) pos = std::min(pos, std::find(list.begin(), list.end(), a));
    if (pos == list.end())
      where = fmt::format("which is not in rank {}'s list", n.rank);
    else if (n.rank == waiter)
      where = "which comes later in the same list";
    else
      where = fmt::format("which rank {} only reaches after its own wait at {}", n.rank, to_string(list[next[n.rank]]));
    return fmt::format("for {}{} on rank {} ({}), {}", to_string(want), alt, n.rank, n.what, where);
  }
};

[[noreturn]] void report_deadlock(const Run& run) {
  const auto& s = run.s;
  std::vector<std::string> waits;
  for (int r = 0; r < s.ranks; ++r) {
    if (run.finished(r)) continue;
    std::vector<Need> all;
    double ready = 0;
    const Need* n = run.unmet(r, all, ready);
    TORCH_INTERNAL_ASSERT(n != nullptr, "pipeline simulator: rank ", r, " is blocked with every input ready");
    waits.push_back(fmt::format("rank {} would wait forever at {} (action {} of its list) {}", r,
                                to_string(s.actions[r][run.next[r]]), run.next[r], run.describe_wait(r, *n)));
  }
  std::string text = waits.front();
  if (waits.size() > 1) {
    text += ", while ";
    for (std::size_t i = 1; i < waits.size(); ++i) text += (i > 1 ? "; " : "") + waits[i];
  }
  throw ConfigError(fmt::format("cohort pipeline: the {} schedule for {} ranks and {} micro-batches deadlocks: {}. "
                                "Reorder the lists: a rank must post each send before it waits on anything that "
                                "needs that send, and run each action after the actions it consumes",
                                to_string(s.kind), s.ranks, s.microbatches, text));
}

}  // namespace

SimulationResult simulate(const Schedule& s, const SimulationCosts& costs) {
  check_lists(s);
  const int p = s.ranks;
  Run run{s, {}, std::vector<std::size_t>(p, 0)};
  std::vector<double> clock(p, 0);
  std::vector<int> live(p, 0);
  SimulationResult result;
  result.busy.assign(p, 0);
  result.peak_activations.assign(p, 0);
  double first_start = -1, last_end = 0;

  // Note [Simulation order]
  // Each rank runs its list in order, an action starting when its rank is free and its
  // inputs are ready. Start times depend only on the lists and the costs, not on the
  // order the ranks are visited in, so sweeping the ranks until none moves is exact.
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (!run.finished(r)) {
        std::vector<Need> all;
        double ready = 0;
        if (run.unmet(r, all, ready) != nullptr) break;
        const auto& a = s.actions[r][run.next[r]];
        const double start = std::max(clock[r], ready);
        const double end = start + cost(costs, a.kind);
        double available = end;  // a receive completes when its send's data arrives: `ready`
        if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient)
          available = end + costs.transfer();  // posted: the sender does not wait
        if (is_compute(a.kind)) {
          if (first_start < 0 || start < first_start) first_start = start;
          last_end = std::max(last_end, end);
          result.busy[r] += end - start;
          if (a.kind == ActionKind::kForward)
            result.peak_activations[r] = std::max(result.peak_activations[r], ++live[r]);
          else if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight)
            --live[r];
        }
        clock[r] = end;
        run.done[key(r, a)] = available;
        ++run.next[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    if (!run.finished(r)) report_deadlock(run);

  result.makespan = first_start < 0 ? 0 : last_end - first_start;
  double busy = 0;
  for (double b : result.busy) busy += b;
  const double idle = p * result.makespan - busy;
  result.bubble_fraction = result.makespan > 0 ? idle / (p * result.makespan) : 0;
  result.bubble_ratio = busy > 0 ? idle / busy : 0;
  return result;
}

FormulaBubble formula_bubble(const Schedule& s) {
  const double p = s.ranks, m = s.microbatches, v = s.virtual_stages;
  switch (s.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B: return {(p - 1) / (m + p - 1), false};
    case ScheduleKind::kInterleaved: return {(p - 1) / (v * m), true};
    case ScheduleKind::kZeroBubble: return {(p - 1) / (3 * m), true};
  }
  return {};
}

}  // namespace cohort::pipeline
