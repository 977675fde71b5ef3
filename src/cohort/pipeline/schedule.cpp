#include "cohort/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "cohort/errors.h"

namespace cohort::pipeline {

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zero-bubble" || name == "zb1p") return ScheduleKind::kZeroBubble;
  throw ConfigError(fmt::format("cohort pipeline: unknown schedule '{}'; use gpipe, 1f1b, interleaved or zero-bubble",
                                name));
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kZeroBubble: return "zero-bubble";
  }
  return "?";
}

std::string to_string(const Action& a) {
  const char* letter = "?";
  switch (a.kind) {
    case ActionKind::kForward: letter = "F"; break;
    case ActionKind::kBackward: letter = "B"; break;
    case ActionKind::kBackwardInput: letter = "I"; break;
    case ActionKind::kBackwardWeight: letter = "W"; break;
    case ActionKind::kSendActivation: letter = "SA"; break;
    case ActionKind::kRecvActivation: letter = "RA"; break;
    case ActionKind::kSendGradient: letter = "SG"; break;
    case ActionKind::kRecvGradient: letter = "RG"; break;
  }
  return fmt::format("{}{}@s{}", letter, a.microbatch, a.stage);
}

namespace {

void validate(const ScheduleOptions& o) {
  const int p = o.ranks(), m = o.microbatches(), v = o.virtual_stages();
  if (p < 1 || m < 1 || v < 1)
    throw ConfigError(fmt::format("cohort pipeline: ranks ({}), micro-batches ({}) and virtual stages ({}) must all be "
                                  "at least 1",
                                  p, m, v));
  const auto name = to_string(o.kind());
  if (o.kind() != ScheduleKind::kInterleaved && v != 1)
    throw ConfigError(fmt::format("cohort pipeline: {} runs one stage per rank, but {} virtual stages were asked for; "
                                  "use --pipeline-schedule interleaved for several stages per rank, or 1 virtual stage",
                                  name, v));
  if ((o.kind() == ScheduleKind::k1F1B || o.kind() == ScheduleKind::kZeroBubble) && m < p)
    throw ConfigError(fmt::format("cohort pipeline: {} needs at least as many micro-batches as pipeline ranks, but got "
                                  "{} micro-batches for {} ranks; use {} micro-batches or more, or gpipe",
                                  name, m, p, p));
  if (o.kind() == ScheduleKind::kInterleaved) {
    if (v < 2)
      throw ConfigError(fmt::format("cohort pipeline: interleaved needs at least 2 virtual stages per rank, got {}; "
                                    "use --virtual-stages 2 or more, or 1f1b",
                                    v));
    if (m % p != 0) {
      const int lower = m / p * p, upper = lower + p;
      throw ConfigError(fmt::format("cohort pipeline: interleaved needs a micro-batch count that is a multiple of the "
                                    "{} pipeline ranks, got {}; use {}",
                                    p, m, lower > 0 ? fmt::format("{} or {}", lower, upper) : std::to_string(upper)));
    }
  }
}

// Adds the compute action with the receive it needs before it and the send its
// result needs after it (when the neighbouring stage is on another rank).
class Builder {
 public:
  explicit Builder(Schedule& s) : s_(s) {}
  void forward(int rank, int stage, int mb) {
    auto& list = s_.actions[rank];
    if (stage > 0 && s_.rank_of(stage - 1) != rank) list.push_back({ActionKind::kRecvActivation, stage, mb});
    list.push_back({ActionKind::kForward, stage, mb});
    if (stage + 1 < s_.stages() && s_.rank_of(stage + 1) != rank)
      list.push_back({ActionKind::kSendActivation, stage, mb});
  }
  // B or I: the pass that consumes the output gradients and produces the input ones.
  void backward(int rank, int stage, int mb, ActionKind kind) {
    auto& list = s_.actions[rank];
    if (stage + 1 < s_.stages() && s_.rank_of(stage + 1) != rank)
      list.push_back({ActionKind::kRecvGradient, stage, mb});
    list.push_back({kind, stage, mb});
    if (stage > 0 && s_.rank_of(stage - 1) != rank) list.push_back({ActionKind::kSendGradient, stage, mb});
  }
  void weight(int rank, int stage, int mb) { s_.actions[rank].push_back({ActionKind::kBackwardWeight, stage, mb}); }

 private:
  Schedule& s_;
};

void gpipe(Schedule& s, Builder& b) {
  for (int r = 0; r < s.ranks; ++r) {
    for (int m = 0; m < s.microbatches; ++m) b.forward(r, r, m);
    for (int m = 0; m < s.microbatches; ++m) b.backward(r, r, m, ActionKind::kBackward);
  }
}

void one_f_one_b(Schedule& s, Builder& b) {
  const int p = s.ranks, n = s.microbatches;
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, n);
    int f = 0, bw = 0;
    for (; f < warmup; ++f) b.forward(r, r, f);
    while (f < n) {
      b.forward(r, r, f++);
      b.backward(r, r, bw++, ActionKind::kBackward);
    }
    while (bw < n) b.backward(r, r, bw++, ActionKind::kBackward);
  }
}

// Megatron-LM's interleaved 1F1B: micro-batches go through the rank's chunks in
// rounds of p, forward in chunk order, backward in reverse chunk order.
void interleaved(Schedule& s, Builder& b) {
  const int p = s.ranks, n = s.microbatches, v = s.virtual_stages, total = n * v;
  auto unit = [&](int k, bool forward) {
    const int group = k / p;
    const int chunk = forward ? group % v : v - 1 - group % v;
    const int mb = (k / (p * v)) * p + k % p;
    return std::pair<int, int>{chunk, mb};
  };
  for (int r = 0; r < p; ++r) {
    int warmup = n == p ? total : std::min(total, (p - r - 1) * 2 + (v - 1) * p);
    int f = 0, bw = 0;
    auto fwd = [&] {
      auto [chunk, mb] = unit(f++, true);
      b.forward(r, chunk * p + r, mb);
    };
    auto bwd = [&] {
      auto [chunk, mb] = unit(bw++, false);
      b.backward(r, chunk * p + r, mb, ActionKind::kBackward);
    };
    while (f < warmup) fwd();
    while (f < total) {
      fwd();
      bwd();
    }
    while (bw < total) bwd();
  }
}

// Note [ZB-H1]
// The zero-bubble schedule is ZB1P, the paper's ZB-H1 (Qi et al. 2023): 1F1B with
// the backward split in two. I, the input gradient, is what the rank before waits
// for; W, the weight gradient, nobody waits for, so it can move. Rank r of p runs
//   p - r - 1 warm-up forwards (1F1B's),
//   r + 1 pairs F I,
//   W F I for each remaining micro-batch (steady state),
//   W I for each remaining I (cool-down),
//   its last r + 1 W passes.
// So every rank holds at most p micro-batches between F and W: 1F1B's p - r plus the
// r W passes rank r defers, and no rank more than 1F1B's rank 0. The deferred W's fill
// the cool-down, where 1F1B waits for gradients: with F = I = W the idle time is p - 1
// per rank, a third of 1F1B's, which is the bubble ratio (p-1)/(3m) exactly for
// every m >= p (schedule_test checks it). In the cool-down the W goes before each I,
// not after: that I's gradient is still on its way, and the W fills the wait.
void zero_bubble(Schedule& s, Builder& b) {
  const int p = s.ranks, n = s.microbatches;
  for (int r = 0; r < p; ++r) {
    int f = 0, i = 0, w = 0;
    auto fwd = [&] { b.forward(r, r, f++); };
    auto input = [&] { b.backward(r, r, i++, ActionKind::kBackwardInput); };
    auto weight = [&] { b.weight(r, r, w++); };
    while (f < p - r - 1) fwd();
    for (int k = 0; k <= r; ++k) fwd(), input();
    while (f < n) weight(), fwd(), input();
    while (i < n) weight(), input();
    while (w < n) weight();
  }
}

}  // namespace

Schedule make_schedule(const ScheduleOptions& options) {
  validate(options);
  Schedule s;
  s.kind = options.kind();
  s.ranks = options.ranks();
  s.microbatches = options.microbatches();
  s.virtual_stages = options.virtual_stages();
  s.actions.assign(s.ranks, {});
  Builder b(s);
  switch (s.kind) {
    case ScheduleKind::kGPipe: gpipe(s, b); break;
    case ScheduleKind::k1F1B: one_f_one_b(s, b); break;
    case ScheduleKind::kInterleaved: interleaved(s, b); break;
    case ScheduleKind::kZeroBubble: zero_bubble(s, b); break;
  }
  return s;
}

}  // namespace cohort::pipeline
