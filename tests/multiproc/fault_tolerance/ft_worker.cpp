// A replica of a fault-tolerant data-parallel job for tests/multiproc/
// fault_tolerance_test.cpp: an MLP trained with DDP over the live replicas, SGD with
// momentum (state a joiner must receive), on a fixed synthetic dataset, with a
// global batch per step (fault_tolerance/step_sampler.h). It can fail on purpose:
//   --die R:PHASE:AT   (repeatable) replica R's first incarnation kills itself (SIGKILL) at
//                      PHASE: "backward" (step AT, while DDP's buckets are in flight),
//                      "vote" (step AT, after its collectives, before its vote), or a
//                      quorum event ("arrived", "formed", "sending", "receiving") of
//                      quorum AT, or of any quorum when AT is 0 (the first such
//                      event: which quorum it falls in depends on timing);
//   --stop R:AT        replica R stops itself (SIGSTOP) in backward at step AT; the
//                      test resumes it (R may be *: whichever replica this process
//                      is, for a node whose ranks the rendezvous chooses);
//   --stop-before-quorum R  replica R's first incarnation stops itself (SIGSTOP) before
//                      it arrives at its first quorum, printing "replica R: stopping
//                      before its first quorum pid P";
//   --degraded-step-ms MS  sleep MS before each step trained with fewer than every
//                      replica, so that a replacement (process start, LibTorch's load)
//                      joins before training ends;
//   --hold-last-step   before the last step, while replicas are missing, abort the
//                      step (end_step(false)) every 200 ms so the quorum re-forms
//                      and takes them in: a test then sees every replica finish,
//                      however slowly a replacement starts (60 s at most);
//   --zero STAGE --shards-per-replica K
//                      ZeRO-1 or 2 inside replicas of K ranks (fault_tolerance/
//                      replica_sharded_optimizer.h); "optimizer" is then a PHASE of
//                      --die too: just after step AT's commit, before the broadcast
//                      of the updated shards inside the replica;
//   --reference        one process, no launcher: the weights every run must reach.
// Each replica writes its final parameters to OUT/final_<replica>.pt.
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/elastic/error_file.h"
#include "cohort/errors.h"
#include "cohort/fault_tolerance/replica_group.h"
#include "cohort/fault_tolerance/replica_sharded_optimizer.h"
#include "cohort/fault_tolerance/step_sampler.h"
#include "cohort/fault_tolerance/training_state.h"

namespace ft = cohort::fault_tolerance;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() : a(register_module("a", torch::nn::Linear(16, 32))), b(register_module("b", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(torch::Tensor x) { return b(torch::tanh(a(x))); }
  torch::nn::Linear a, b;
};
TORCH_MODULE(Net);

constexpr int kAnyReplica = -2;  // R given as *

struct Failure {
  int replica = -1;
  std::string phase;
  std::int64_t at = -1;
};

Failure parse_failure(const std::string& text) {
  Failure f;
  auto first = text.find(':');
  auto second = text.find(':', first + 1);
  f.replica = text.substr(0, first) == "*" ? kAnyReplica : std::stoi(text.substr(0, first));
  if (second == std::string::npos) {
    f.phase = "stop";
    f.at = std::stoll(text.substr(first + 1));
  } else {
    f.phase = text.substr(first + 1, second - first - 1);
    f.at = std::stoll(text.substr(second + 1));
  }
  return f;
}

std::vector<torch::Tensor> parameters_of(Net& net) {
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

int run(int argc, char** argv) {
  std::int64_t steps = 40;
  std::string out_dir = ".";
  bool reference = false;
  int degraded_ms = 0;
  bool hold_last = false;
  int zero_stage = 0;
  int shards = 1;
  std::vector<Failure> dies;
  Failure stop;
  int stop_before_quorum = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(argv[++i]); };
    if (a == "--steps") steps = std::stoll(next());
    else if (a == "--out") out_dir = next();
    else if (a == "--reference") reference = true;
    else if (a == "--degraded-step-ms") degraded_ms = std::stoi(next());
    else if (a == "--hold-last-step") hold_last = true;
    else if (a == "--zero") zero_stage = std::stoi(next());
    else if (a == "--shards-per-replica") shards = std::stoi(next());
    else if (a == "--die") dies.push_back(parse_failure(next()));
    else if (a == "--stop") stop = parse_failure(next());
    else if (a == "--stop-before-quorum") stop_before_quorum = std::stoi(next());
    else {
      std::cerr << "ft_worker: unknown argument " << a << "\n";
      return 2;
    }
  }
  torch::manual_seed(0);
  auto inputs = torch::randn({512, 16});
  auto labels = inputs.matmul(torch::randn({16, 4})).argmax(1);
  torch::manual_seed(1);
  Net net;
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  // Small buckets, so that the broadcast of the updated shards takes several.
  ft::ReplicaShardedOptimizer zero(
      net->parameters(),
      [](std::vector<torch::Tensor> shard) {
        return std::make_unique<torch::optim::SGD>(shard, torch::optim::SGDOptions(0.1).momentum(0.9));
      },
      cohort::zero::ShardedOptimizerOptions().shard_gradients(zero_stage == 2).bucket_cap_bytes(512));
  ft::StepSampler sampler(ft::StepSamplerOptions(512, 32).seed(7));

  auto options = ft::ReplicaGroupOptions::from_env(cohort::comm::process_environment())
                     .configuration("steps " + std::to_string(steps) +
                                    (zero_stage > 0 ? " zero " + std::to_string(zero_stage) : ""))
                     .shards_per_replica(shards);
  int my_id = -1, my_incarnation = 0;
  options.on_event([&](const std::string& event) {
    std::printf("replica %d: %s\n", my_id, event.c_str());
    std::fflush(stdout);
    for (const auto& die : dies)
      if (my_incarnation == 0 && die.replica == my_id &&
          (die.at == 0 ? event.rfind(die.phase + " q", 0) == 0 : event == die.phase + " q" + std::to_string(die.at)))
        raise(SIGKILL);
  });
  auto replicas = ft::ReplicaGroup::join(options);
  my_id = replicas.replica_id();
  my_incarnation = replicas.incarnation();
  std::printf("replica %d: incarnation %d pid %d\n", my_id, my_incarnation, static_cast<int>(getpid()));
  std::fflush(stdout);
  if (my_id == stop_before_quorum && my_incarnation == 0) {
    std::printf("replica %d: stopping before its first quorum pid %d\n", my_id, static_cast<int>(getpid()));
    std::fflush(stdout);
    raise(SIGSTOP);
  }
  if (zero_stage > 0)
    replicas.on_transfer([&](std::ostream& o) { ft::save_training_state(o, *net, zero); },
                         [&](std::istream& i) { ft::load_training_state(i, *net, zero); });
  else
    replicas.on_transfer([&](std::ostream& o) { ft::save_training_state(o, *net, &optimizer); },
                         [&](std::istream& i) { ft::load_training_state(i, *net, &optimizer); });
  const bool first = my_incarnation == 0;
  auto armed = [&](const Failure& f, const char* phase, std::int64_t step) {
    return first && (f.replica == my_id || f.replica == kAnyReplica) && f.phase == phase && f.at == step;
  };
  auto dies_at = [&](const char* phase, std::int64_t step) {
    for (const auto& die : dies)
      if (armed(die, phase, step)) return true;
    return false;
  };
  // Fires during backward, after the output layer's bucket was launched. Under ZeRO-2
  // the gradient sharder takes the weight's gradient first, so the hook sits on the
  // hidden activation instead (forward below), which backward reaches at the same point.
  auto in_backward = [&](torch::Tensor g) {
    if (dies_at("backward", replicas.step())) raise(SIGKILL);
    if (armed(stop, "stop", replicas.step())) {
      std::printf("replica %d: stopping at step %lld pid %d\n", my_id, static_cast<long long>(replicas.step()),
                  static_cast<int>(getpid()));
      std::fflush(stdout);
      stop.replica = -1;
      raise(SIGSTOP);
    }
    return g;
  };
  if (zero_stage < 2) net->a->weight.register_hook(in_backward);
  // A pointer, not std::optional: GCC 12 at -O2 saw an optional DDP as maybe uninitialized (-Werror).
  std::unique_ptr<cohort::ddp::DistributedDataParallel<Net>> ddp;
  auto forward = [&](const torch::Tensor& x) {
    if (zero_stage < 2) return (*ddp)(x);
    auto hidden = torch::tanh(net->a(x));
    hidden.register_hook(in_backward);
    return net->b(hidden);
  };

  std::int64_t committed = 0;
  int held = 0;
  std::vector<torch::Tensor> before_last;
  while (replicas.step() < steps) {
    const ft::Quorum* quorum = nullptr;
    try {
      quorum = &replicas.begin_step();
    } catch (const ft::TrainingFinished& e) {
      std::printf("replica %d: %s\n", my_id, e.what());
      return 0;
    }
    const auto& q = *quorum;
    if (q.size < replicas.max_replicas()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(degraded_ms));
      if (hold_last && replicas.step() == steps - 1 && held < 300) {
        ++held;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        replicas.end_step(false);  // every member holds alike: they see the same quorum
        continue;
      }
    }
    const auto step = replicas.step();
    bool ok = true;
    try {
      if (q.changed) {
        ddp.reset();  // its hooks go before the new DDP adds its own
        if (zero_stage > 0) zero.on_quorum(q);
        if (zero_stage < 2) ddp = std::make_unique<cohort::ddp::DistributedDataParallel<Net>>(net, q.group);
      }
      auto index = torch::tensor(sampler.indices(step, q.rank, q.size), torch::kLong);
      auto x = inputs.index_select(0, index);
      auto loss = torch::nn::functional::cross_entropy(forward(x),
                                                       labels.index_select(0, index)) *
                  sampler.loss_weight(step, q.rank, q.size);
      if (zero_stage > 0)
        zero.zero_grad();
      else
        optimizer.zero_grad();
      loss.backward();
    } catch (const cohort::Error& e) {
      std::printf("replica %d: step %lld failed: %s\n", my_id, static_cast<long long>(step),
                  std::string(e.what()).substr(0, 160).c_str());
      ok = false;
    } catch (const c10::Error& e) {
      std::printf("replica %d: step %lld failed: %s\n", my_id, static_cast<long long>(step),
                  e.what_without_backtrace());
      ok = false;
    }
    // Whether or not this rank's step failed (Note [Telling the other replicas of a
    // failed step]).
    if (zero_stage > 0 && !zero.average_over_replicas(q, ok) && ok) {
      std::printf("replica %d: step %lld failed: %s\n", my_id, static_cast<long long>(step),
                  zero.last_failure().substr(0, 160).c_str());
      ok = false;
    }
    if (dies_at("vote", step)) raise(SIGKILL);
    if (replicas.end_step(ok)) {
      if (step == steps - 1) before_last = parameters_of(net);
      if (dies_at("optimizer", step)) raise(SIGKILL);
      if (zero_stage == 0) {
        optimizer.step();
      } else if (!zero.step(replicas)) {
        std::printf("replica %d: discarded its state after step %lld\n", my_id, static_cast<long long>(step));
        std::fflush(stdout);
      }
      ++committed;
    }
  }
  replicas.finish();
  const auto& s = replicas.stats();
  std::printf("replica %d: done at step %lld: committed %lld aborted %lld quorums %lld sent %lld received %lld\n",
              my_id, static_cast<long long>(replicas.step()), static_cast<long long>(committed),
              static_cast<long long>(s.aborted_steps), static_cast<long long>(s.quorums),
              static_cast<long long>(s.transfers_sent), static_cast<long long>(s.transfers_received));
  std::fflush(stdout);
  if (reference) {
    torch::save(parameters_of(net), out_dir + "/reference.pt");
    torch::save(before_last, out_dir + "/reference_before_last.pt");
  } else {
    torch::save(parameters_of(net), out_dir + "/final_" + std::to_string(my_id) + ".pt");
  }
  return 0;
}

// As a user's program should: an error that ends the process is written to the
// launcher's error file (what `cohort run` reads to decide on a replacement).
int main(int argc, char** argv) {
  return cohort::elastic::record([&] { return run(argc, argv); });
}
