// Gradient accumulation, communication hooks and uneven inputs, each against the
// single-process reference.
#include <cmath>

#include "cohort/ddp/comm_hook.h"
#include "ddp/checks.h"
#include "ddp/models.h"

namespace cohort::testing {

using ddp::DistributedDataParallel;

int run_no_sync(const WorkerArgs& a, comm::World& world) {
  const int r = world.rank(), n = world.size(), k = a.micro_steps;
  torch::manual_seed(42);
  auto reference = make_mlp();
  torch::manual_seed(42);
  DistributedDataParallel ddp(make_mlp(), world.group(), ddp_options(a));
  auto ref_opt = make_sgd(*reference);
  auto opt = make_sgd(*ddp.module());
  bool local_while_accumulating = true;
  for (int step = 0; step < a.steps; ++step) {
    // Micro-batch j of rank q is block j * n + q of the global batch.
    auto b = global_batch(step, n * k * kRowsPerRank);
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(b.x), b.y).backward();
    opt.zero_grad();
    for (int j = 0; j < k; ++j) {
      auto micro = [&](const torch::Tensor& t) { return rows_of(t, j * n + r); };
      auto step_once = [&] { (torch::mse_loss(ddp(micro(b.x)), micro(b.y)) / k).backward(); };
      if (j + 1 < k) {
        auto guard = ddp.no_sync();
        step_once();
        // Under no_sync the gradients stay local, so ranks must still disagree.
        if (n > 1) {
          auto g = ddp.module()->parameters().front().grad().sum().reshape({1}).clone();
          auto all = world.group().all_gather(g);
          local_while_accumulating = local_while_accumulating && !torch::equal(all[0], all[1]);
        }
      } else {
        step_once();
      }
    }
    ref_opt.step();
    opt.step();
  }
  if (!local_while_accumulating) {
    std::cout << "no_sync FAILED rank " << r << ": gradients were synchronised under no_sync" << std::endl;
    return 1;
  }
  return report("no_sync", world, max_param_diff(*reference, *ddp.module()), 0);
}

namespace {

// A hook written against the public interface: exact all-reduce, counting buckets.
struct CountingHook : ddp::CommHook {
  int started = 0;
  std::string name() const override { return "counting"; }
  ddp::BucketWork start(comm::Group& group, ddp::GradBucket& bucket) override {
    ++started;
    return ddp::BucketWork(group.all_reduce_async(bucket.buffer()));
  }
};

}  // namespace

// One step with a hook. The gradients must lie within the hook's documented error
// of the exact average (comm_hook.h): |error| <= (n + 1) * eps * mean_q |g_q|,
// elementwise, where g_q is rank q's gradient and eps the compressed type's.
int run_hook(const WorkerArgs& a, comm::World& world) {
  const int r = world.rank(), n = world.size();
  auto counting = std::make_shared<CountingHook>();
  std::shared_ptr<ddp::CommHook> hook;
  double eps = 0;
  if (a.hook == "fp16") hook = ddp::fp16_compress_hook(), eps = std::ldexp(1.0, -11);
  else if (a.hook == "bf16") hook = ddp::bf16_compress_hook(), eps = std::ldexp(1.0, -8);
  else if (a.hook == "counting") hook = counting;
  else throw std::invalid_argument("unknown hook " + a.hook);

  torch::manual_seed(42);
  auto reference = make_mlp();
  torch::manual_seed(42);
  DistributedDataParallel ddp(make_mlp(), world.group(), ddp_options(a).comm_hook(hook));
  auto b = global_batch(0, n * kRowsPerRank);
  // Each rank's gradient, as the reference computes it.
  auto params = reference->parameters();
  std::vector<torch::Tensor> exact(params.size()), magnitude(params.size());
  for (int q = 0; q < n; ++q) {
    reference->zero_grad();
    torch::mse_loss(reference->forward(rows_of(b.x, q)), rows_of(b.y, q)).backward();
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto g = params[i].grad().to(torch::kDouble);
      exact[i] = q ? exact[i] + g / n : g / n;
      magnitude[i] = q ? magnitude[i] + g.abs() / n : g.abs() / n;
    }
  }
  for (int step = 0; step < 2; ++step) {  // the second step runs on rebuilt buckets
    ddp.module()->zero_grad();
    torch::mse_loss(ddp(rows_of(b.x, r)), rows_of(b.y, r)).backward();
  }
  double worst_excess = 0, worst_error = 0;
  auto got = ddp.module()->parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    auto error = (got[i].grad().to(torch::kDouble) - exact[i]).abs();
    auto bound = (n + 1) * eps * magnitude[i] + 1e-7;
    worst_excess = std::max(worst_excess, (error - bound).max().item<double>());
    worst_error = std::max(worst_error, error.max().item<double>());
  }
  bool ok = worst_excess <= 0;
  std::string extra;
  if (a.hook == "counting") {
    const int expected = 2 * static_cast<int>(ddp.reducer().plan().buckets.size());
    ok = ok && counting->started == expected;
    extra = " buckets " + std::to_string(counting->started) + "/" + std::to_string(expected);
  } else {
    ok = ok && worst_error > 0;  // a compressing hook that changed nothing did not run
  }
  std::cout << "hook " << a.hook << (ok ? " ok" : " FAILED") << " rank " << r << " world " << n
            << " max_error " << worst_error << " max_excess_over_bound " << worst_excess << extra << std::endl;
  return ok ? 0 : 1;
}

// Rank q holds 3 batches when q is even, 5 when odd. The reference replays the
// steps: step s averages the gradients of the ranks still holding data, dividing
// by the world size or by the number of those ranks (Note [Join]).
int run_join(const WorkerArgs& a, comm::World& world) {
  const int r = world.rank(), n = world.size();
  auto batches = [](int q) { return q % 2 == 0 ? 3 : 5; };
  int most = 0;
  for (int q = 0; q < n; ++q) most = std::max(most, batches(q));

  torch::manual_seed(42);
  auto reference = make_mlp();
  auto ref_opt = make_sgd(*reference);
  auto params = reference->parameters();
  for (int step = 0; step < most; ++step) {
    auto b = global_batch(step, n * kRowsPerRank);
    std::vector<torch::Tensor> sum(params.size());
    int active = 0;
    for (int q = 0; q < n; ++q) {
      if (step >= batches(q)) continue;
      ++active;
      reference->zero_grad();
      torch::mse_loss(reference->forward(rows_of(b.x, q)), rows_of(b.y, q)).backward();
      for (std::size_t i = 0; i < params.size(); ++i) sum[i] = sum[i].defined() ? sum[i] + params[i].grad() : params[i].grad().clone();
    }
    const double divisor = a.divide_by_initial_world_size ? n : active;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sum[i] / divisor;
    ref_opt.step();
  }

  torch::manual_seed(42);
  DistributedDataParallel ddp(make_mlp(), world.group(), ddp_options(a));
  auto opt = make_sgd(*ddp.module());
  ddp.join(
      [&] {
        for (int step = 0; step < batches(r); ++step) {
          auto b = global_batch(step, n * kRowsPerRank);
          opt.zero_grad();
          torch::mse_loss(ddp(rows_of(b.x, r)), rows_of(b.y, r)).backward();
          opt.step();
        }
      },
      ddp::JoinOptions().divide_by_initial_world_size(a.divide_by_initial_world_size));
  return report("join", world, max_param_diff(*reference, *ddp.module()), 0);
}

}  // namespace cohort::testing
