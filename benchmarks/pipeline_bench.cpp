// The pipeline schedules' bubble and memory, measured (BENCHMARKS.md, issue 13). One
// process per pipeline rank under `cohort run`; compare_pipeline.sh runs it beside
// pipeline_peer.py (PyTorch's torch.distributed.pipelining) with the same model:
//
//   cohort run --nproc-per-node P pipeline_bench [--schedules gpipe,1f1b,interleaved,zero-bubble]
//       [--microbatches 4,8,16] [--forward-ms F] [--input-ms I] [--weight-ms W] [--virtual V]
//       [--warmup 2] [--steps 5] [--trace]
//   pipeline_bench verify [--forward-ms F] [--input-ms I] [--weight-ms W]
//
// Each stage SLEEPS instead of computing (Note [Sleeping stages]), so a step's time
// is the schedule's alone: P ranks on two cores cannot compute P stages at once, but
// they can sleep at once. Per rank the work is m (F + I + W) ms whatever the
// schedule (interleaved: each of the V stages of a rank sleeps F/V, I/V, W/V), so
//   measured bubble = 1 - ideal / step        (GPipe, 1F1B: a fraction of the step)
//                   = (step - ideal) / ideal  (interleaved, zero-bubble: a ratio to
//                                              the work, as the formulas give it)
// with step the median over the timed steps of the slowest rank's step time (every
// step starts after a barrier). Beside it: formula_bubble() and simulate() with the
// same costs. Memory: each rank's peak_live_microbatches as the runtime measured it,
// and the same count taken inside the model (forwards run minus weight gradients done).
//
// Rank 0 prints one JSON line per configuration, then the table, then one JSON line
// with every result. `verify` times the sleeping stage's passes in one process.
// --trace: every rank prints, for the last timed step, each sleep as <F|I|W>start-end
// in ms from the step's start on that rank (origin_us: that start on the machine's
// steady clock, shared by the ranks), and its schedule's action list; with
// `cohort run --timeline DIR` the sends and receives can be laid beside them.
// Note [Transfer latency] explains the latency measured first and the sim+lat column.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/prctl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/world.h"
#include "cohort/elastic/error_file.h"
#include "cohort/trace/world_timeline.h"
#include "cohort/pipeline/pipeline.h"
#include "cohort/pipeline/wire.h"

namespace {

namespace pp = cohort::pipeline;
using cohort::comm::World;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Args {
  std::vector<std::string> schedules{"gpipe", "1f1b", "interleaved", "zero-bubble"};
  std::vector<int> microbatches;  // default: P, 2P, 4P
  double forward_ms = 20, input_ms = 20, weight_ms = 20;
  int virtual_stages = 2;  // interleaved only
  int warmup = 2;
  int steps = 5;
  int rows = 2;   // rows per micro-batch
  int width = 8;  // features
  bool trace = false;
};

// Note [Sleeping stages]
// std::this_thread::sleep_for overshoots by the thread's timer slack (50 us by
// default) on top of the wake-up latency; over the hundreds of sleeps of a step that
// adds up, so the slack is set to 1 ns, leaving the wake-up latency (0.1 ms per
// sleep on the VM of BENCHMARKS.md: see `verify`). Per thread, so set before every
// sleep (the autograd engine runs CPU backward on the calling thread anyway). In a
// plain backward the engine happens to run W's sleep before I's; the runtime sends
// the input gradient after both, so the order does not matter.

// --trace: every sleep of the last timed step, as (what, start, end) in ms since the
// step's barrier, printed by each rank.
struct TraceEvent {
  char what;
  double start_ms, end_ms;
};
bool g_tracing = false;
Clock::time_point g_trace_origin;
std::vector<TraceEvent> g_trace;

void sleep_ms(double ms, char what) {
  thread_local bool slack = (prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0), true);
  (void)slack;
  const auto t0 = Clock::now();
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  if (g_tracing) {
    auto rel = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - g_trace_origin).count(); };
    g_trace.push_back({what, rel(t0), rel(Clock::now())});
  }
}

// The stage's input path: forward sleeps F, backward sleeps I and passes the gradient.
struct SleepInput : torch::autograd::Function<SleepInput> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double forward_ms, double input_ms) {
    ctx->saved_data["input_ms"] = input_ms;
    sleep_ms(forward_ms, 'F');
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    sleep_ms(ctx->saved_data["input_ms"].toDouble(), 'I');
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

// Counts, per process, the micro-batches whose forward has run and whose weight
// gradient has not: the activations a real stage would hold.
struct LiveCount {
  int live = 0;
  int peak = 0;
};

// The stage's parameter path: backward sleeps W. The engine runs it only when the
// parameter's gradient is wanted (a plain backward, or the W pass), never in the
// input-gradient pass, which asks for the stage input's gradient only.
struct SleepWeight : torch::autograd::Function<SleepWeight> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, double weight_ms, int64_t counter) {
    ctx->saved_data["weight_ms"] = weight_ms;
    ctx->saved_data["counter"] = counter;
    return w.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    sleep_ms(ctx->saved_data["weight_ms"].toDouble(), 'W');
    auto* count = reinterpret_cast<LiveCount*>(ctx->saved_data["counter"].toInt());
    --count->live;
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

struct Costs {
  double forward_ms, input_ms, weight_ms;
};

// y = SleepInput(x) + SleepWeight(w), broadcast over x's rows. The first stage's input
// is data, without a gradient: both runtimes (cohort's and PyTorch's) skip its input
// pass and run the whole backward in the W pass, as they must for a real first stage,
// whose input pass computes the gradients of its inner activations that its weight
// gradients need. Here w is mixed into the input path of stage 0 (x + 0 w), so that
// its W pass sleeps I + W, as a real stage 0's would compute them.
struct SleepStageImpl : torch::nn::Module {
  SleepStageImpl(bool first, Costs costs, LiveCount* count) : first(first), costs(costs), count(count) {
    w = register_parameter("w", torch::zeros({1}));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = first ? x + w * 0 : x;
    auto a = SleepInput::apply(h, costs.forward_ms, costs.input_ms);
    auto b = SleepWeight::apply(w, costs.weight_ms, reinterpret_cast<int64_t>(count));
    if (torch::GradMode::is_enabled()) count->peak = std::max(count->peak, ++count->live);
    return a + b;
  }
  bool first;
  Costs costs;
  LiveCount* count;
  at::Tensor w;
};
TORCH_MODULE(SleepStage);

template <typename T>
T median(std::vector<T> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

double round_to(double x, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale + 0.0;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Times each pass of the sleeping stage in this process (median of 5): the
// construction works if a plain backward sleeps I + W, the input pass I, the weight
// pass W (stage 0's W pass: I + W).
int verify(const Args& a) {
  torch::set_num_threads(1);
  LiveCount count;
  const Costs costs{a.forward_ms, a.input_ms, a.weight_ms};
  std::vector<std::vector<double>> t(7);
  for (int rep = 0; rep < 5; ++rep) {
    for (bool first : {false, true}) {
      SleepStage stage(first, costs, &count);
      auto make_input = [&] {
        auto x = torch::randn({a.rows, a.width});
        return first ? x : x.requires_grad_(true);
      };
      auto g = torch::ones({a.rows, a.width});
      // Plain backward.
      auto x = make_input();
      auto t0 = Clock::now();
      auto y = stage->forward(x);
      t[first ? 4 : 0].push_back(ms_since(t0));
      t0 = Clock::now();
      torch::autograd::backward({y}, {g});
      t[first ? 5 : 1].push_back(ms_since(t0));
      // Split: the input pass (grad wrt x only), then the weight pass (inputs = params).
      x = make_input();
      y = stage->forward(x);
      if (!first) {
        t0 = Clock::now();
        torch::autograd::grad({y}, {x}, {g}, /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
        t[2].push_back(ms_since(t0));
      }
      t0 = Clock::now();
      torch::autograd::backward({y}, {g}, /*retain_graph=*/false, /*create_graph=*/false, stage->parameters());
      t[first ? 6 : 3].push_back(ms_since(t0));
    }
  }
  const double F = a.forward_ms, I = a.input_ms, W = a.weight_ms;
  const std::vector<std::pair<std::string, double>> rows{
      {"stage > 0: forward", F},          {"stage > 0: plain backward", I + W},
      {"stage > 0: input pass (I)", I},   {"stage > 0: weight pass (W)", W},
      {"stage 0: forward", F},            {"stage 0: plain backward", I + W},
      {"stage 0: weight pass (W)", I + W}};
  std::cout << fmt::format("{:<30}{:>10}{:>10}\n", "pass (median of 5)", "ms", "expected");
  Json line = {{"impl", "cohort"}, {"kind", "verify"}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double m = median(t[i]);
    std::cout << fmt::format("{:<30}{:>10.2f}{:>10.2f}\n", rows[i].first, m, rows[i].second);
    line[rows[i].first] = round_to(m, 3);
  }
  std::cout << line.dump() << std::endl;
  return 0;
}

// Note [Transfer latency]
// The one-way time of one runtime transfer (send_tensors to recv_tensors: a header
// and one [rows, width] float tensor), from rank 0 to rank 1, both asleep before it
// as in the benchmark: `waiting`, rank 1 already blocked in the receive when rank 0
// sends; `posted`, rank 0 sent 5 ms before rank 1 reaches the receive (the time from
// reaching it to having the tensors). Same machine, so steady_clock is shared.
struct Latency {
  double waiting_ms = 0, posted_ms = 0, asleep_ms = 0;
};

Latency measure_latency(const Args& a, World& world) {
  Latency out;
  if (world.size() < 2) return out;
  auto& g = world.group();
  const int rank = world.rank();
  auto now_ms = [] { return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count(); };
  auto payload = torch::randn({a.rows, a.width});
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<double> lat;
    for (int k = 0; k < 21; ++k) {
      g.barrier();
      double t0 = 0, t1 = 0;
      if (rank == 0) {
        sleep_ms(mode == 0 ? 10 : 0, '-');
        t0 = now_ms();
        auto sent = pp::send_tensors(g, {payload}, 1, pp::Direction::kActivation, 1, k, c10::Device(c10::kCPU));
        if (mode == 2) sleep_ms(20, '-');
        for (auto& p : sent.pending) p.wait();
      } else if (rank == 1) {
        sleep_ms(mode == 0 ? 0 : 5, '-');
        t0 = now_ms();
        pp::recv_tensors(g, 0, pp::Direction::kActivation, 1, k, c10::Device(c10::kCPU));
        t1 = now_ms();
      }
      auto all = g.all_gather(torch::tensor({t0, t1}, torch::kDouble));
      auto a0 = all[0].contiguous(), a1 = all[1].contiguous();
      const double sent_at = a0.data_ptr<double>()[0];
      const double reached = a1.data_ptr<double>()[0], got = a1.data_ptr<double>()[1];
      lat.push_back(mode == 0 ? got - sent_at : got - reached);
    }
    (mode == 0 ? out.waiting_ms : mode == 1 ? out.posted_ms : out.asleep_ms) = median(lat);
  }
  return out;
}

struct Result {
  std::string schedule;
  int P, m, V;
  double step_ms, ideal_ms, measured, measured_fraction, formula, simulated, simulated_latency;
  double sim_makespan_ms;  // simulate() with the nominal costs and free transfers
  bool is_ratio;
  std::vector<int> peak_live, model_peak_live;
  double runtime_bubble;  // 1 - compute / step, the runtime's own, median over steps, worst rank
};

std::string join(const std::vector<int>& xs) {
  std::ostringstream o;
  for (std::size_t i = 0; i < xs.size(); ++i) o << (i ? "," : "") << xs[i];
  return o.str();
}

Result run_config(const Args& a, World& world, const std::string& name, int m, const Latency& latency) {
  const int P = world.size(), rank = world.rank();
  const auto kind = pp::parse_schedule_kind(name);
  const int V = kind == pp::ScheduleKind::kInterleaved ? a.virtual_stages : 1;
  const Costs costs{a.forward_ms / V, a.input_ms / V, a.weight_ms / V};
  auto count = std::make_unique<LiveCount>();
  std::vector<pp::PipelineStage> stages;
  for (int c = 0; c < V; ++c) {
    const int index = rank + c * P;
    auto module = SleepStage(index == 0, costs, count.get());
    stages.emplace_back(module.ptr(), index, [module](const pp::TensorList& in) mutable {
      return pp::TensorList{module->forward(in.at(0))};
    });
  }
  auto loss = [](const pp::TensorList& out, const pp::TensorList& target) {
    return torch::mse_loss(out.at(0), target.at(0));
  };
  pp::Pipeline pipe(std::move(stages), world.group(),
                    pp::PipelineOptions(loss).schedule(kind).microbatches(m).virtual_stages(V));
  torch::manual_seed(7);
  auto x = torch::randn({m * a.rows, a.width});
  auto y = torch::zeros({m * a.rows, a.width});
  const pp::TensorList inputs = pipe.is_first() ? pp::TensorList{x} : pp::TensorList{};
  const pp::TensorList targets = pipe.is_last() ? pp::TensorList{y} : pp::TensorList{};

  for (int i = 0; i < a.warmup; ++i) {
    world.group().barrier();
    pipe.step(inputs, targets);
  }
  count->peak = 0;
  std::vector<double> step_s, compute_s;
  int peak_live = 0;
  for (int i = 0; i < a.steps; ++i) {
    world.group().barrier();
    g_tracing = a.trace && i == a.steps - 1;
    g_trace.clear();
    g_trace_origin = Clock::now();
    auto r = pipe.step(inputs, targets);
    g_tracing = false;
    if (a.trace && i == a.steps - 1) {
      // S: the step as timed here; R: as the runtime timed it (StepResult::step_seconds).
      g_trace.push_back({'S', 0, std::chrono::duration<double, std::milli>(Clock::now() - g_trace_origin).count()});
      g_trace.push_back({'R', 0, r.step_seconds * 1e3});
    }
    step_s.push_back(r.step_seconds);
    compute_s.push_back(r.compute_seconds);
    peak_live = std::max(peak_live, r.peak_live_microbatches);
  }

  if (a.trace) {
    // One line per rank, in rank order: each sleep as <what><start>-<end> in ms.
    for (int r = 0; r < P; ++r) {
      world.group().barrier();
      if (r != rank) continue;
      std::ostringstream o;
      o << "trace " << name << " P=" << P << " m=" << m << " rank " << rank << " origin_us "
        << fmt::format("{:.1f}", std::chrono::duration<double, std::micro>(g_trace_origin.time_since_epoch()).count())
        << ":";
      for (const auto& e : g_trace) o << fmt::format(" {}{:.1f}-{:.1f}", e.what, e.start_ms, e.end_ms);
      o << "\n  actions:";
      for (const auto& act : pipe.schedule().actions[rank]) o << " " << pp::to_string(act);
      std::cout << o.str() << std::endl;
    }
    world.group().barrier();
  }

  // Every rank's step times, peaks and compute times, to every rank.
  std::vector<double> mine = step_s;
  mine.insert(mine.end(), compute_s.begin(), compute_s.end());
  mine.push_back(peak_live);
  mine.push_back(count->peak);
  auto all = world.group().all_gather(torch::tensor(mine, torch::kDouble));
  std::vector<double> slowest(a.steps, 0), bubbles(a.steps, 0);
  Result res{name, P, m, V};
  for (int r = 0; r < P; ++r) {
    auto v = all[r].contiguous();
    const double* d = v.data_ptr<double>();
    for (int i = 0; i < a.steps; ++i) {
      slowest[i] = std::max(slowest[i], d[i]);
      bubbles[i] = std::max(bubbles[i], 1 - d[a.steps + i] / d[i]);
    }
    res.peak_live.push_back(static_cast<int>(d[2 * a.steps]));
    res.model_peak_live.push_back(static_cast<int>(d[2 * a.steps + 1]));
  }
  res.step_ms = median(slowest) * 1e3;
  res.ideal_ms = m * (a.forward_ms + a.input_ms + a.weight_ms);
  const auto formula = pp::formula_bubble(pipe.schedule());
  res.is_ratio = formula.is_ratio;
  res.formula = formula.value;
  res.measured_fraction = 1 - res.ideal_ms / res.step_ms;
  res.measured = res.is_ratio ? (res.step_ms - res.ideal_ms) / res.ideal_ms : res.measured_fraction;
  auto sim = pp::simulate(pipe.schedule(), pp::SimulationCosts()
                                               .forward(costs.forward_ms)
                                               .backward_input(costs.input_ms)
                                               .backward_weight(costs.weight_ms));
  res.simulated = res.is_ratio ? sim.bubble_ratio : sim.bubble_fraction;
  res.sim_makespan_ms = sim.makespan;
  // The same with every transfer taking the measured latency, and the step's work as
  // the formulas count it (nominal costs): in the measured bubble's convention.
  auto sim_t = pp::simulate(pipe.schedule(), pp::SimulationCosts()
                                                 .forward(costs.forward_ms)
                                                 .backward_input(costs.input_ms)
                                                 .backward_weight(costs.weight_ms)
                                                 .transfer(latency.waiting_ms));
  res.simulated_latency = res.is_ratio ? sim_t.bubble_ratio : sim_t.bubble_fraction;
  res.runtime_bubble = median(bubbles);
  return res;
}

Json to_json(const Result& r) {
  return Json{{"impl", "cohort"},
              {"schedule", r.schedule},
              {"P", r.P},
              {"m", r.m},
              {"V", r.V},
              {"step_ms", round_to(r.step_ms, 2)},
              {"ideal_ms", round_to(r.ideal_ms, 2)},
              {"convention", r.is_ratio ? "ratio" : "fraction"},
              {"bubble", round_to(r.measured, 4)},
              {"bubble_fraction", round_to(r.measured_fraction, 4)},
              {"formula", round_to(r.formula, 4)},
              {"simulated", round_to(r.simulated, 4)},
              {"simulated_with_latency", round_to(r.simulated_latency, 4)},
              {"sim_makespan_ms", round_to(r.sim_makespan_ms, 2)},
              {"rel_err_formula", round_to((r.measured - r.formula) / r.formula, 4)},
              {"runtime_bubble", round_to(r.runtime_bubble, 4)},
              {"peak_live", r.peak_live},
              {"model_peak_live", r.model_peak_live}};
}

int bench(const Args& a) {
  torch::set_num_threads(1);
  auto world = World::init(cohort::trace::traced());
  const int P = world.size();
  auto ms = a.microbatches;
  if (ms.empty()) ms = {P, 2 * P, 4 * P};
  const auto latency = measure_latency(a, world);
  if (world.rank() == 0)
    std::cout << Json{{"impl", "cohort"},
                      {"kind", "latency"},
                      {"P", P},
                      {"waiting_ms", round_to(latency.waiting_ms, 3)},
                      {"posted_ms", round_to(latency.posted_ms, 3)},
                      {"posted_sender_asleep_ms", round_to(latency.asleep_ms, 3)}}
                     .dump()
              << std::endl;
  std::vector<Result> results;
  for (const auto& name : a.schedules)
    for (int m : ms) {
      results.push_back(run_config(a, world, name, m, latency));
      if (world.rank() == 0) std::cout << to_json(results.back()).dump() << std::endl;
    }
  if (world.rank() != 0) return 0;

  std::cout << fmt::format("\nPipeline bubble, {} ranks, F={} I={} W={} ms per micro-batch and rank, {} timed steps "
                           "after {} warm-up (median of the slowest rank)\n",
                           P, a.forward_ms, a.input_ms, a.weight_ms, a.steps, a.warmup);
  std::cout << fmt::format("transfer latency rank 0 -> 1 (Note [Transfer latency]): {:.3f} ms to a waiting receive, "
                           "{:.3f} ms from a posted send\n",
                           latency.waiting_ms, latency.posted_ms);
  std::cout << fmt::format("{:<12}{:>3}{:>4}{:>3}{:>9}{:>8}{:>8}{:>6}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}  {}\n", "schedule",
                           "P", "m", "V", "step ms", "ideal", "+sim ms", "conv", "measured", "formula", "sim",
                           "err/frm", "sim+lat", "err/s+l", "peak live per rank (model's count)");
  for (const auto& r : results) {
    std::cout << fmt::format("{:<12}{:>3}{:>4}{:>3}{:>9.1f}{:>8.0f}{:>8.1f}{:>6}{:>9.4f}{:>9.4f}{:>9.4f}{:>8.1f}%{:>9.4f}"
                             "{:>8.1f}%  {} ({})\n",
                             r.schedule, r.P, r.m, r.V, r.step_ms, r.ideal_ms, r.step_ms - r.sim_makespan_ms,
                             r.is_ratio ? "ratio" : "frac", r.measured, r.formula, r.simulated,
                             100 * (r.measured - r.formula) / r.formula, r.simulated_latency,
                             100 * (r.measured - r.simulated_latency) / r.simulated_latency, join(r.peak_live),
                             join(r.model_peak_live));
  }
  std::cout << "conv: frac = 1 - ideal/step (GPipe, 1F1B), ratio = (step - ideal)/ideal (interleaved, zero-bubble); "
               "+sim ms: step - simulate()'s makespan (nominal costs, free transfers); sim+lat: simulate() with every "
               "transfer taking the measured latency\n"
            << "expected peak live: GPipe m on every rank; 1F1B min(m, P - rank)\n";
  Json all = Json::array();
  for (const auto& r : results) all.push_back(to_json(r));
  std::cout << Json{{"impl", "cohort"}, {"kind", "summary"}, {"results", all}}.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort pipeline benchmark: bubble and memory of the schedules with sleeping stages"};
  Args a;
  auto costs = [&a](CLI::App* sub) {
    sub->add_option("--forward-ms", a.forward_ms, "forward sleep per micro-batch and rank");
    sub->add_option("--input-ms", a.input_ms, "input-gradient sleep per micro-batch and rank");
    sub->add_option("--weight-ms", a.weight_ms, "weight-gradient sleep per micro-batch and rank");
    sub->add_option("--rows", a.rows, "rows per micro-batch")->check(CLI::PositiveNumber);
  };
  costs(&app);
  app.add_option("--schedules", a.schedules, "gpipe, 1f1b, interleaved, zero-bubble")->delimiter(',');
  app.add_option("--microbatches", a.microbatches, "micro-batch counts (default P, 2P, 4P)")->delimiter(',');
  app.add_option("--virtual", a.virtual_stages, "stages per rank under interleaved")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first");
  app.add_option("--steps", a.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_flag("--trace", a.trace, "each rank prints its sleeps in the last timed step");
  auto* ver = app.add_subcommand("verify", "time the sleeping stage's passes in this process");
  costs(ver);
  CLI11_PARSE(app, argc, argv);
  if (ver->parsed()) return verify(a);
  return cohort::elastic::record([&] { return bench(a); });
}
