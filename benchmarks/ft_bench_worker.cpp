// The worker of benchmarks/compare_fault_tolerance.py: an MLP trained with DDP over
// Gloo on a fixed synthetic dataset, one global batch per step split over the ranks
// (fault_tolerance/step_sampler.h), in one of two modes:
//   --mode ft     under `cohort run --fault-tolerance in-process`: a ReplicaGroup's
//                 quorum, begin_step/end_step every step, a step that fails is redone
//                 by the survivors, a replacement gets the state by live transfer;
//   --mode plain  under `cohort run --max-restarts N`: World::init's group, a failure
//                 ends the process and the launcher restarts the whole job, which
//                 resumes from the last checkpoint.
// The checkpoint (--checkpoint FILE, plain mode) is simulated: rank 0 writes the
// number of the next step to FILE after every 10th step, and a restarted job starts
// from that step; it loads nothing else (no weights), so loading costs nothing here.
// With --log-steps each rank prints one JSON line per step it ends:
//   {"rank":R,"inc":I,"step":S,"ms":T,"committed":B,"quorum":Q,"size":N}
// T is the wall-clock millisecond (std::chrono::system_clock, comparable with
// Python's time.time()) at which the step ended; I is the incarnation (ft) or the
// restart count (plain); Q the quorum id (ft) or the restart count (plain). At the
// end, rank 0 prints {"summary":...,"median_step_ms":M} over the steps after --warmup.
//   ft_bench_worker --mode ft|plain [--steps N] [--features F] [--hidden H]
//                   [--global-batch B] [--warmup W] [--log-steps] [--checkpoint FILE]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/elastic/error_file.h"
#include "cohort/errors.h"
#include "cohort/fault_tolerance/replica_group.h"
#include "cohort/fault_tolerance/step_sampler.h"
#include "cohort/fault_tolerance/training_state.h"

namespace ft = cohort::fault_tolerance;

namespace {

constexpr std::int64_t kDataset = 8192;
constexpr std::int64_t kClasses = 10;
constexpr std::int64_t kCheckpointEvery = 10;

struct Args {
  std::string mode = "ft";
  std::int64_t steps = 1000000;
  std::int64_t features = 512;
  std::int64_t hidden = 1024;
  std::int64_t global_batch = 256;
  std::int64_t warmup = 20;
  bool log_steps = false;
  std::string checkpoint;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--mode") a.mode = next();
    else if (flag == "--steps") a.steps = std::stoll(next());
    else if (flag == "--features") a.features = std::stoll(next());
    else if (flag == "--hidden") a.hidden = std::stoll(next());
    else if (flag == "--global-batch") a.global_batch = std::stoll(next());
    else if (flag == "--warmup") a.warmup = std::stoll(next());
    else if (flag == "--log-steps") a.log_steps = true;
    else if (flag == "--checkpoint") a.checkpoint = next();
    else throw std::invalid_argument("ft_bench_worker: unknown argument " + flag);
  }
  if (a.mode != "ft" && a.mode != "plain") throw std::invalid_argument("--mode must be ft or plain, not " + a.mode);
  return a;
}

long long wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct NetImpl : torch::nn::Module {
  NetImpl(std::int64_t features, std::int64_t hidden)
      : a(register_module("a", torch::nn::Linear(features, hidden))),
        b(register_module("b", torch::nn::Linear(hidden, hidden))),
        c(register_module("c", torch::nn::Linear(hidden, kClasses))) {}
  torch::Tensor forward(torch::Tensor x) { return c(torch::relu(b(torch::relu(a(x))))); }
  torch::nn::Linear a, b, c;
};
TORCH_MODULE(Net);

// The same training on both modes: the data, the model (the same initial weights on
// every rank), the sampler, one step.
struct Training {
  explicit Training(const Args& args)
      : inputs((torch::manual_seed(0), torch::randn({kDataset, args.features}))),
        labels(inputs.matmul(torch::randn({args.features, kClasses})).argmax(1)),
        sampler(ft::StepSamplerOptions(kDataset, args.global_batch).seed(7)),
        net((torch::manual_seed(1), Net(args.features, args.hidden))),
        optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)) {}

  // Forward and backward of this rank's part of `step`'s global batch.
  void backward(cohort::ddp::DistributedDataParallel<Net>& ddp, std::int64_t step, int rank, int size) {
    auto index = torch::tensor(sampler.indices(step, rank, size), torch::kLong);
    auto loss = torch::nn::functional::cross_entropy(ddp(inputs.index_select(0, index)), labels.index_select(0, index)) *
                sampler.loss_weight(step, rank, size);
    optimizer.zero_grad();
    loss.backward();
  }

  torch::Tensor inputs, labels;
  ft::StepSampler sampler;
  Net net;
  torch::optim::SGD optimizer;
};

// Step completion times, for the median step time that rank 0 reports.
struct Clock {
  std::vector<double> step_ms;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  void tick() {
    auto now = std::chrono::steady_clock::now();
    step_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  }
  double median(std::int64_t skip) const {
    std::vector<double> v(step_ms.begin() + std::min<std::size_t>(skip, step_ms.size()), step_ms.end());
    if (v.empty()) return -1;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }
};

void log_step(int rank, int inc, std::int64_t step, bool committed, std::int64_t quorum, int size) {
  std::printf("{\"rank\":%d,\"inc\":%d,\"step\":%lld,\"ms\":%lld,\"committed\":%s,\"quorum\":%lld,\"size\":%d}\n", rank,
              inc, static_cast<long long>(step), wall_ms(), committed ? "true" : "false",
              static_cast<long long>(quorum), size);
  std::fflush(stdout);
}

void summary(const Args& args, const Clock& clock, std::int64_t steps, int size, std::int64_t aborted) {
  std::printf("{\"summary\":\"%s\",\"steps\":%lld,\"size\":%d,\"aborted\":%lld,\"median_step_ms\":%.3f}\n",
              args.mode.c_str(), static_cast<long long>(steps), size, static_cast<long long>(aborted),
              clock.median(args.warmup));
  std::fflush(stdout);
}

int train_ft(const Args& args) {
  Training t(args);
  auto options = ft::ReplicaGroupOptions::from_env(cohort::comm::process_environment());
  if (args.log_steps) {
    // The phases of a recovery (benchmarks/scale/recovery.py): "arrived q5", "formed q5", ...
    const int rank = std::stoi(cohort::comm::process_environment().at("RANK"));
    options.on_event([rank](const std::string& what) {
      std::printf("{\"event\":\"%s\",\"rank\":%d,\"ms\":%lld}\n", what.c_str(), rank, wall_ms());
      std::fflush(stdout);
    });
  }
  auto replicas = ft::ReplicaGroup::join(options);
  replicas.on_transfer([&](std::ostream& o) { ft::save_training_state(o, *t.net, &t.optimizer); },
                       [&](std::istream& i) { ft::load_training_state(i, *t.net, &t.optimizer); });
  const int id = replicas.replica_id();
  // A pointer, not std::optional: GCC 12 at -O2 saw an optional DDP as maybe uninitialized (-Werror).
  std::unique_ptr<cohort::ddp::DistributedDataParallel<Net>> ddp;
  Clock clock;
  int size = 0;
  while (replicas.step() < args.steps) {
    const ft::Quorum* quorum = nullptr;
    try {
      quorum = &replicas.begin_step();
    } catch (const ft::TrainingFinished&) {
      return 0;
    }
    const auto& q = *quorum;
    const auto step = replicas.step();
    size = q.size;
    bool ok = true;
    try {
      if (q.changed) {
        ddp.reset();  // its hooks go before the new DDP adds its own
        ddp = std::make_unique<cohort::ddp::DistributedDataParallel<Net>>(t.net, q.group);
      }
      t.backward(*ddp, step, q.rank, q.size);
    } catch (const cohort::Error&) {
      ok = false;  // a peer died: the quorum aborts the step and redoes it without it
    } catch (const c10::Error&) {
      ok = false;
    }
    const bool committed = replicas.end_step(ok);
    if (committed) t.optimizer.step();
    if (args.log_steps) log_step(id, replicas.incarnation(), step, committed, q.id, q.size);
    if (committed) clock.tick();
  }
  replicas.finish();
  if (id == 0) summary(args, clock, replicas.step(), size, replicas.stats().aborted_steps);
  return 0;
}

std::int64_t read_checkpoint(const std::string& path) {
  std::int64_t step = 0;
  std::ifstream in(path);
  if (in) in >> step;
  return step;
}

void write_checkpoint(const std::string& path, std::int64_t next_step) {
  {
    std::ofstream out(path + ".tmp");
    out << next_step << "\n";
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

int train_plain(const Args& args) {
  Training t(args);
  auto world = cohort::comm::World::init();
  const char* restart_env = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int restart = restart_env ? std::atoi(restart_env) : 0;
  const std::int64_t first = args.checkpoint.empty() ? 0 : read_checkpoint(args.checkpoint);
  cohort::ddp::DistributedDataParallel<Net> ddp(t.net, world.group());
  Clock clock;
  for (std::int64_t step = first; step < args.steps; ++step) {
    t.backward(ddp, step, world.rank(), world.size());  // a peer's death ends the process
    t.optimizer.step();
    if (args.log_steps) log_step(world.rank(), restart, step, true, restart, world.size());
    clock.tick();
    if (!args.checkpoint.empty() && world.rank() == 0 && (step + 1) % kCheckpointEvery == 0)
      write_checkpoint(args.checkpoint, step + 1);
  }
  if (world.rank() == 0) summary(args, clock, args.steps - first, world.size(), 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cohort::elastic::record([&] {
    const Args args = parse(argc, argv);
    return args.mode == "ft" ? train_ft(args) : train_plain(args);
  });
}
