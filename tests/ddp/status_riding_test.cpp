// Note [The status rides in the last bucket] (step_status.h) off its default path
// (issue 33's review): worlds of 3 and 4, mixed dtypes (the last bucket half, double, or
// float behind half/double ones; a rebuild that switches riding on), the last
// bucket unused (find_unused_parameters, static_graph), join with uneven inputs,
// failed backwards with bucket views, no_sync, custom hooks, the mismatch text and
// the modulo, each against a single-process reference. JoinRidesFailed also holds
// a bug the review found beside it: a rank joined during a failed first step made
// a bucket rebuild due that the active ranks did not (fixed in shadow_backward).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <thread>

#include "cohort/ddp/comm_hook.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/ddp/powersgd_hook.h"
#include "cohort/ddp/step_status.h"
#include "cohort/errors.h"
#include "ddp/reference.h"
#include "support/thread_world.h"

namespace {
using cohort::ddp::DistributedDataParallel;
using cohort::ddp::DistributedDataParallelOptions;
using cohort::testing::MidFail;
using cohort::testing::MidFailImpl;
using cohort::testing::run_thread_world;
using cohort::testing::throw_in_backward;
using namespace std::chrono_literals;

// What went wrong on any rank, collected from the ranks' threads and reported
// once they are done.
class Problems {
 public:
  void add(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    list_.push_back(std::move(what));
  }
  void check(int rank, int step, double err, double tolerance = 1e-5) {
    if (err > tolerance)
      add("rank " + std::to_string(rank) + " step " + std::to_string(step) + " err " + std::to_string(err));
  }
  void report(const std::string& prefix = "") const {
    for (const auto& p : list_) ADD_FAILURE() << prefix << p;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> list_;
};

cohort::comm::InitOptions options() { return cohort::testing::quick_thread_world_options().timeout(15s); }

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return out;
}

// Largest error, relative for half parameters (their tolerance is looser).
double error_of(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& expected,
                double* half_error = nullptr) {
  EXPECT_EQ(params.size(), expected.size());
  double worst = 0, worst_half = 0;
  for (std::size_t i = 0; i < params.size() && i < expected.size(); ++i) {
    if (params[i].numel() == 0) continue;
    auto g = params[i].grad().defined() ? params[i].grad() : torch::zeros_like(params[i]);
    double e = (g.to(torch::kDouble) - expected[i].to(torch::kDouble)).abs().max().item<double>();
    if (params[i].scalar_type() == torch::kHalf) worst_half = std::max(worst_half, e);
    else worst = std::max(worst, e);
  }
  if (half_error) *half_error = worst_half;
  return worst;
}

// ---------------------------------------------------------------------------
// A model with several dtypes; `variant` fixes the registration order, and so
// which dtype's bucket comes last in the first plan (reverse registration order).
struct HDImpl : torch::nn::Cloneable<HDImpl> {
  HDImpl() { reset(); }
  void reset() override {
    h = register_parameter("h", torch::randn({3}).to(torch::kHalf));
    d = register_parameter("d", torch::randn({3}, torch::kDouble));
  }
  torch::Tensor h, d;
};

struct MixedImpl : torch::nn::Cloneable<MixedImpl> {
  explicit MixedImpl(int variant = 0) : variant(variant) { reset(); }
  void reset() override {
    auto reg_hd = [&] {
      if (variant == 1) {
        d = register_parameter("d", torch::randn({3}, torch::kDouble));
        h = register_parameter("h", torch::randn({3}).to(torch::kHalf));
      } else {
        h = register_parameter("h", torch::randn({3}).to(torch::kHalf));
        d = register_parameter("d", torch::randn({3}, torch::kDouble));
      }
    };
    if (variant != 2) reg_hd();
    a = register_module("a", torch::nn::Linear(6, 8));
    b = register_module("b", torch::nn::Linear(8, 3));
    if (variant == 2) {  // in a submodule registered after a and b, so that they come last in parameters()
      holder = register_module("p", std::make_shared<HDImpl>());
      h = holder->h;
      d = holder->d;
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (holder) {  // the clone's child, not reset()'s
      h = holder->h;
      d = holder->d;
    }
    return b(torch::relu(a(x))) * h.to(torch::kFloat) + d.to(torch::kFloat);
  }
  int variant;
  torch::nn::Linear a{nullptr}, b{nullptr};
  std::shared_ptr<HDImpl> holder;
  torch::Tensor h, d;
};
TORCH_MODULE(Mixed);

class MixedDtypes : public ::testing::TestWithParam<std::tuple<int, int, bool, std::int64_t>> {};

// Last bucket in the first plan / after the rebuild: variant 0: half /
// double (riding switches on); variant 1: double / double; variant 2: float /
// double (the slots move to another bucket and dtype).
TEST_P(MixedDtypes, GradientsMatchTheReferenceEveryStep) {
  // Plain variables, not structured bindings: C++17 lambdas cannot capture those (clang refuses).
  const auto variant = std::get<0>(GetParam());
  const auto world_size = std::get<1>(GetParam());
  const auto view = std::get<2>(GetParam());
  const auto cap = std::get<3>(GetParam());
  torch::manual_seed(11);
  Mixed reference(variant);
  const int steps = 4;
  std::vector<torch::Tensor> xs;
  std::vector<std::vector<torch::Tensor>> expected;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(torch::randn({4 * world_size, 6}));
    auto model = std::dynamic_pointer_cast<MixedImpl>(reference->clone());
    model->zero_grad();
    for (int r = 0; r < world_size; ++r)
      (model->forward(xs[s].chunk(world_size)[r]).pow(2).mean() / world_size).backward();
    expected.push_back(grads_of(model->parameters()));
  }
  Problems problems;
  std::vector<std::size_t> plan_sizes;
  run_thread_world(
      world_size,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<MixedImpl>(reference->clone());
        DistributedDataParallel ddp(Mixed(model), world.group(),
                                    DistributedDataParallelOptions()
                                        .gradient_as_bucket_view(view)
                                        .bucket_cap_bytes(cap)
                                        .first_bucket_cap_bytes(cap));
        for (int s = 0; s < steps; ++s) {
          ddp.module()->zero_grad();
          ddp(xs[s].chunk(world_size)[world.rank()]).pow(2).mean().backward();
          double half_err = 0;
          double err = error_of(ddp.module()->parameters(), expected[s], &half_err);
          const auto& plan = ddp.reducer().plan();
          if (err > 1e-5 || half_err > 2e-2) {
            problems.add("rank " + std::to_string(world.rank()) + " step " + std::to_string(s) +
                               " err " + std::to_string(err) + " half err " + std::to_string(half_err) +
                               " last bucket " + plan.buckets.back().dtype);
          }
        }
      },
      options());
  problems.report();
}

INSTANTIATE_TEST_SUITE_P(Review, MixedDtypes,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(2, 3),
                                            ::testing::Values(false, true),
                                            ::testing::Values(std::int64_t{1}, std::int64_t{25} << 20)));

// ---------------------------------------------------------------------------
// The last bucket's parameters unused in some steps, or on one rank only.
struct UnusedLastImpl : torch::nn::Cloneable<UnusedLastImpl> {
  UnusedLastImpl() { reset(); }
  void reset() override {
    c = register_module("c", torch::nn::Linear(6, 3));  // registered first: planned last
    a = register_module("a", torch::nn::Linear(6, 8));
    b = register_module("b", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_c) {
    auto y = b(torch::relu(a(x)));
    return use_c ? y + c(x) : y;
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(UnusedLast);

struct UnusedCase {
  int world;
  bool view;
  std::int64_t cap;
  bool static_graph;
};
std::ostream& operator<<(std::ostream& os, const UnusedCase& c) {
  return os << "world " << c.world << " view " << c.view << " cap " << c.cap << " static " << c.static_graph;
}

class UnusedLastBucket : public ::testing::TestWithParam<UnusedCase> {};

TEST_P(UnusedLastBucket, GradientsMatchTheReferenceEveryStep) {
  const auto c = GetParam();
  const int W = c.world;
  // uses[s][r]: whether rank r uses c in step s. Step 0: rank 0 does not, so
  // the rebuild (from rank 0's arrivals) puts c last.
  std::vector<std::vector<bool>> uses;
  if (c.static_graph) {
    for (int s = 0; s < 5; ++s) {
      std::vector<bool> u(W, true);
      u[1] = false;  // the same every step, on one rank only
      uses.push_back(u);
    }
  } else {
    uses = {std::vector<bool>(W, true), std::vector<bool>(W, true), std::vector<bool>(W, false),
            std::vector<bool>(W, false), std::vector<bool>(W, true), std::vector<bool>(W, true)};
    uses[0][0] = false;
    uses[1][1] = false;
    uses[3][W - 1] = true;
  }
  const int steps = static_cast<int>(uses.size());
  torch::manual_seed(12);
  UnusedLast reference;
  std::vector<torch::Tensor> xs;
  std::vector<std::vector<torch::Tensor>> expected;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(torch::randn({2 * W, 6}));
    auto model = std::dynamic_pointer_cast<UnusedLastImpl>(reference->clone());
    model->zero_grad();
    for (int r = 0; r < W; ++r)
      (model->forward(xs[s].chunk(W)[r], uses[s][r]).pow(2).mean() / W).backward();
    expected.push_back(grads_of(model->parameters()));
  }
  Problems problems;
  run_thread_world(
      W,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<UnusedLastImpl>(reference->clone());
        auto opts = DistributedDataParallelOptions()
                        .gradient_as_bucket_view(c.view)
                        .bucket_cap_bytes(c.cap)
                        .first_bucket_cap_bytes(c.cap);
        if (c.static_graph) opts.static_graph(true);
        else opts.find_unused_parameters(true);
        DistributedDataParallel ddp(UnusedLast(model), world.group(), opts);
        for (int s = 0; s < steps; ++s) {
          ddp.module()->zero_grad();
          ddp(xs[s].chunk(W)[world.rank()], static_cast<bool>(uses[s][world.rank()])).pow(2).mean().backward();
          double err = error_of(ddp.module()->parameters(), expected[s]);
          if (err > 1e-5) {
            const auto& plan = ddp.reducer().plan();
            std::string last;
            for (auto i : plan.buckets.back().params) last += std::to_string(i) + " ";
            problems.add("rank " + std::to_string(world.rank()) + " step " + std::to_string(s) + " err " +
                               std::to_string(err) + " last bucket params " + last);
          }
        }
      },
      options());
  problems.report();
}

INSTANTIATE_TEST_SUITE_P(Review, UnusedLastBucket,
                         ::testing::Values(UnusedCase{3, false, 1, false}, UnusedCase{3, true, 1, false},
                                           UnusedCase{4, false, 25 << 20, false}, UnusedCase{4, true, 25 << 20, false},
                                           UnusedCase{3, false, 1, true}, UnusedCase{3, true, 1, true},
                                           UnusedCase{4, true, 25 << 20, true}, UnusedCase{2, true, 1, false}));

// ---------------------------------------------------------------------------
// join() with uneven inputs: rank r has batches[r] batches.
struct JoinCase {
  bool divide_by_initial;
  bool find_unused;
  bool view;
  std::int64_t cap;
};
std::ostream& operator<<(std::ostream& os, const JoinCase& c) {
  return os << "initial " << c.divide_by_initial << " unused " << c.find_unused << " view " << c.view << " cap "
            << c.cap;
}
class JoinRides : public ::testing::TestWithParam<JoinCase> {};

TEST_P(JoinRides, ActiveRanksGetTheAverageOfTheActiveRanks) {
  const auto c = GetParam();
  const int W = 3;
  const std::vector<int> batches = {3, 1, 4};
  const int steps = 4;
  torch::manual_seed(13);
  auto reference = cohort::testing::small_mlp();
  std::vector<std::vector<torch::Tensor>> xs(W);
  for (int r = 0; r < W; ++r)
    for (int s = 0; s < batches[r]; ++s) xs[r].push_back(torch::randn({2, 6}));
  std::vector<std::vector<torch::Tensor>> expected;
  for (int s = 0; s < steps; ++s) {
    int active = 0;
    for (int r = 0; r < W; ++r) active += batches[r] > s;
    const double divisor = c.divide_by_initial ? W : active;
    auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
    model->zero_grad();
    for (int r = 0; r < W; ++r)
      if (batches[r] > s) (model->forward(xs[r][s]).pow(2).mean() / divisor).backward();
    expected.push_back(grads_of(model->parameters()));
  }
  Problems problems;
  run_thread_world(
      W,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
        DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(),
                                    DistributedDataParallelOptions()
                                        .find_unused_parameters(c.find_unused)
                                        .gradient_as_bucket_view(c.view)
                                        .bucket_cap_bytes(c.cap)
                                        .first_bucket_cap_bytes(c.cap));
        const int r = world.rank();
        ddp.join(
            [&] {
              for (int s = 0; s < batches[r]; ++s) {
                ddp.module()->zero_grad();
                ddp(xs[r][s]).pow(2).mean().backward();
                double err = error_of(ddp.module()->parameters(), expected[s]);
                problems.check(r, s, err);
              }
            },
            cohort::ddp::JoinOptions().divide_by_initial_world_size(c.divide_by_initial));
        // After the join, one more ordinary step on every rank is exact.
        ddp.module()->zero_grad();
        auto x = xs[0][0];
        ddp(x).pow(2).mean().backward();
      },
      options());
  problems.report();
}

INSTANTIATE_TEST_SUITE_P(Review, JoinRides,
                         ::testing::Values(JoinCase{true, false, false, 1}, JoinCase{false, false, true, 1},
                                           JoinCase{true, true, true, 25 << 20}, JoinCase{false, true, false, 1}));

// A joined rank mirrors a step in which an active rank's backward failed.
// `warm`: one ordinary step first (so the bucket rebuild is behind every rank);
// `hook`: a custom all-reduce hook, so the status does not ride (control).
class JoinRidesFailed : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(JoinRidesFailed, AFailedStepWhileARankIsJoinedLeavesTheNextStepExact) {
  const auto warm = std::get<0>(GetParam());
  const auto hook = std::get<1>(GetParam());
  const int W = 3;
  torch::manual_seed(14);
  auto reference = cohort::testing::small_mlp();
  auto bad = torch::randn({4, 6});
  auto good = torch::randn({4, 6});
  auto model_ref = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
  model_ref->zero_grad();
  for (int r = 0; r < 2; ++r) (model_ref->forward(good.chunk(2)[r]).pow(2).mean() / W).backward();
  auto expected = grads_of(model_ref->parameters());
  Problems problems;
  run_thread_world(
      W,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
        auto opts = DistributedDataParallelOptions().gradient_as_bucket_view(true).bucket_cap_bytes(1).first_bucket_cap_bytes(1);
        if (hook) opts.comm_hook(cohort::ddp::all_reduce_hook());
        DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(), opts);
        const int r = world.rank();
        ddp.join([&] {
          if (r == 2) return;  // joins at once
          if (warm) {
            ddp.module()->zero_grad();
            ddp(good.chunk(2)[r]).pow(2).mean().backward();
          }
          auto input = bad.chunk(2)[r].clone().requires_grad_(true);
          if (r == 0) throw_in_backward(input);
          try {
            ddp(input).pow(2).mean().backward();
            problems.add("rank " + std::to_string(r) + ": the failed step completed");
          } catch (const std::exception&) {
          }
          ddp.module()->zero_grad();
          ddp(good.chunk(2)[r]).pow(2).mean().backward();
          double err = error_of(ddp.module()->parameters(), expected);
          if (err > 1e-5) {
            problems.add("rank " + std::to_string(r) + " err " + std::to_string(err));
          }
        });
      },
      options());
  problems.report();
}

INSTANTIATE_TEST_SUITE_P(Review, JoinRidesFailed, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// ---------------------------------------------------------------------------
// Failed backwards at world 3 with bucket views: one rank fails after all of its
// parameters' gradients arrived (a hook on the input), or in the middle.
class FailedRides : public ::testing::TestWithParam<std::tuple<int, bool, std::int64_t, bool>> {};

TEST_P(FailedRides, PeersAreToldAndTheNextStepsAreExact) {
  const auto failing = std::get<0>(GetParam());
  const auto view = std::get<1>(GetParam());
  const auto cap = std::get<2>(GetParam());
  const auto mid = std::get<3>(GetParam());
  const int W = 3;
  torch::manual_seed(15);
  MidFail reference;
  auto x = torch::randn({6, 6});
  auto failing_x = torch::randn({6, 6});
  auto ref = std::dynamic_pointer_cast<MidFailImpl>(reference->clone());
  ref->zero_grad();
  for (int r = 0; r < W; ++r) (ref->forward(x.chunk(W)[r], false).pow(2).mean() / W).backward();
  auto expected = grads_of(ref->parameters());
  Problems problems;
  run_thread_world(
      W,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<MidFailImpl>(reference->clone());
        DistributedDataParallel ddp(MidFail(model), world.group(),
                                    DistributedDataParallelOptions().gradient_as_bucket_view(view).bucket_cap_bytes(cap).first_bucket_cap_bytes(cap));
        const int r = world.rank();
        // Step 1 ordinary, so the failure happens after the rebuild.
        ddp.module()->zero_grad();
        ddp(x.chunk(W)[r], false).pow(2).mean().backward();
        auto input = failing_x.chunk(W)[r].clone().requires_grad_(true);
        const bool me = r == failing;
        if (me && !mid) throw_in_backward(input);
        bool threw = false;
        std::string what;
        try {
          ddp(input, me && mid).pow(2).mean().backward();
        } catch (const cohort::CommError& e) {
          threw = true;
          what = e.what();
        } catch (const std::exception& e) {
          threw = true;
          what = e.what();
        }
        {
          if (!threw) problems.add("rank " + std::to_string(r) + ": the failed step completed");
          else if (!me && what.find("rank " + std::to_string(failing)) == std::string::npos)
            problems.add("rank " + std::to_string(r) + ": error does not name the failing rank: " + what);
        }
        for (int s = 0; s < 2; ++s) {
          ddp.module()->zero_grad();
          ddp(x.chunk(W)[r], false).pow(2).mean().backward();
          double err = error_of(ddp.module()->parameters(), expected);
          problems.check(r, s, err);
        }
      },
      options());
  problems.report();
}

INSTANTIATE_TEST_SUITE_P(Review, FailedRides,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(false, true),
                                            ::testing::Values(std::int64_t{1}, std::int64_t{25} << 20),
                                            ::testing::Values(false, true)));

// ---------------------------------------------------------------------------
// no_sync accumulation then a synced step, twice (the second round after the rebuild).
TEST(NoSyncRides, AccumulatedThenSyncedIsExact) {
  for (bool view : {false, true}) {
    const int W = 3;
    torch::manual_seed(16);
    auto reference = cohort::testing::small_mlp();
    std::vector<torch::Tensor> xs;
    for (int k = 0; k < 6; ++k) xs.push_back(torch::randn({3 * W, 6}));
    std::vector<std::vector<torch::Tensor>> expected;
    for (int round = 0; round < 2; ++round) {
      auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
      model->zero_grad();
      for (int k = 0; k < 3; ++k)
        for (int r = 0; r < W; ++r)
          (model->forward(xs[3 * round + k].chunk(W)[r]).pow(2).mean() / W).backward();
      expected.push_back(grads_of(model->parameters()));
    }
    Problems problems;
    run_thread_world(
        W,
        [&](cohort::comm::World& world) {
          auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
          DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(),
                                      DistributedDataParallelOptions().gradient_as_bucket_view(view).bucket_cap_bytes(1).first_bucket_cap_bytes(1));
          const int r = world.rank();
          for (int round = 0; round < 2; ++round) {
            ddp.module()->zero_grad();
            {
              auto guard = ddp.no_sync();
              for (int k = 0; k < 2; ++k) ddp(xs[3 * round + k].chunk(W)[r]).pow(2).mean().backward();
            }
            ddp(xs[3 * round + 2].chunk(W)[r]).pow(2).mean().backward();
            double err = error_of(ddp.module()->parameters(), expected[round]);
            if (err > 1e-5) {
              problems.add("view " + std::to_string(view) + " rank " + std::to_string(r) + " round " +
                                 std::to_string(round) + " err " + std::to_string(err));
            }
          }
        },
        options());
    problems.report();
  }
}

// ---------------------------------------------------------------------------
// Custom hooks at world 3 keep the status's own all-reduce and still work.
TEST(HooksRide, Fp16AndPowerSGDAtWorldThree) {
  const int W = 3;
  torch::manual_seed(17);
  auto reference = cohort::testing::small_mlp();
  std::vector<torch::Tensor> xs;
  for (int s = 0; s < 4; ++s) xs.push_back(torch::randn({2 * W, 6}));
  std::vector<std::vector<torch::Tensor>> expected;
  for (int s = 0; s < 4; ++s) {
    auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
    model->zero_grad();
    for (int r = 0; r < W; ++r) (model->forward(xs[s].chunk(W)[r]).pow(2).mean() / W).backward();
    expected.push_back(grads_of(model->parameters()));
  }
  for (int which = 0; which < 2; ++which) {
    Problems problems;
    std::vector<std::vector<torch::Tensor>> last(W);
    run_thread_world(
        W,
        [&](cohort::comm::World& world) {
          auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
          auto hook = which == 0 ? cohort::ddp::fp16_compress_hook()
                                 : std::shared_ptr<cohort::ddp::CommHook>(cohort::ddp::powersgd_hook(
                                       cohort::ddp::PowerSGDOptions().start_powerSGD_iter(2).min_compression_rate(0)));
          DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(),
                                      DistributedDataParallelOptions().comm_hook(hook).bucket_cap_bytes(1).first_bucket_cap_bytes(1));
          const int r = world.rank();
          for (int s = 0; s < 4; ++s) {
            ddp.module()->zero_grad();
            ddp(xs[s].chunk(W)[r]).pow(2).mean().backward();
            double err = error_of(ddp.module()->parameters(), expected[s]);
            if ((which == 0 || s < 1) && err > 1e-2) {
              problems.add("hook " + std::to_string(which) + " rank " + std::to_string(r) + " step " +
                                 std::to_string(s) + " err " + std::to_string(err));
            }
          }
          last[r] = grads_of(ddp.module()->parameters());
        },
        options());
    for (int r = 1; r < W; ++r)
      for (std::size_t i = 0; i < last[0].size(); ++i)
        EXPECT_TRUE(torch::equal(last[0][i], last[r][i])) << "hook " << which << " rank " << r << " param " << i;
    problems.report();
  }
}

// ---------------------------------------------------------------------------
// The step-mismatch error at world 3, riding.
TEST(MismatchRides, WorldThreeNamesEveryRanksStep) {
  std::mutex m;
  std::vector<std::string> whats(3);
  run_thread_world(
      3,
      [&](cohort::comm::World& world) {
        auto model = cohort::testing::small_mlp();
        DistributedDataParallel ddp(model, world.group());
        auto x = torch::ones({4, 6}) * (world.rank() + 1);
        ddp(x).sum().backward();
        if (world.rank() == 2) {
          auto ignored = ddp(x);
          (torch::zeros({}, torch::requires_grad()) * 1).backward();
        }
        try {
          ddp(x).sum().backward();
        } catch (const cohort::CommError& e) {
          std::lock_guard<std::mutex> lock(m);
          whats[world.rank()] = e.what();
        }
      },
      options());
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(whats[r].find("rank 0 in step 2, rank 1 in step 2, rank 2 in step 3 (modulo 2^22)"), std::string::npos)
        << "rank " << r << ": " << whats[r];
}

// ---------------------------------------------------------------------------
// StepStatus riding, directly, with step numbers around 2^22 and beyond.
TEST(StatusModulo, LargeStepsRideExactly) {
  struct Case {
    std::uint64_t s0, s1;
    bool f0, f1;
    bool differ;  // expected to be told
  };
  const std::uint64_t K = std::uint64_t{1} << 22;
  const std::vector<Case> cases = {
      {K - 1, K - 1, false, true, false}, {K, K, true, false, false},         {K - 1, K, false, false, true},
      {(std::uint64_t{1} << 40) + 7, (std::uint64_t{1} << 40) + 7, true, true, false},
      {5, K + 5, false, false, false},  // documented: compared modulo 2^22
  };
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (const auto& c : cases) {
      Problems problems;
      run_thread_world(
          2,
          [&](cohort::comm::World& world) {
            cohort::ddp::StepStatus status(world.group(), c10::Device(c10::kCPU));
            auto bucket = torch::zeros({10 + 2}, dtype);
            status.ride_on(bucket.narrow(0, 10, 2));
            const int r = world.rank();
            status.launch(r == 0 ? c.f0 : c.f1, r == 0 ? c.s0 : c.s1);
            world.group().all_reduce(bucket);
            bool told = false;
            std::vector<int> failed;
            try {
              failed = status.wait();
            } catch (const cohort::CommError&) {
              told = true;
            }
            std::vector<int> want;
            if (c.f0) want.push_back(0);
            if (c.f1) want.push_back(1);
            if (told != c.differ) problems.add("told " + std::to_string(told));
            if (!told && failed != want) problems.add("failed ranks wrong");
          },
          options());
      problems.report(std::string(c10::toString(dtype)) + " steps " + std::to_string(c.s0) + "/" +
                      std::to_string(c.s1) + ": ");
    }
  }
}

// ---------------------------------------------------------------------------
// A zero-element parameter alone in the last bucket.
struct EmptyLastImpl : torch::nn::Cloneable<EmptyLastImpl> {
  EmptyLastImpl() { reset(); }
  void reset() override {
    e = register_parameter("e", torch::zeros({0}));
    a = register_module("a", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return a(x) + e.sum(); }
  torch::Tensor e;
  torch::nn::Linear a{nullptr};
};
TORCH_MODULE(EmptyLast);

TEST(EmptyLastRides, AZeroElementLastBucket) {
  const int W = 3;
  torch::manual_seed(18);
  EmptyLast reference;
  auto x = torch::randn({6, 6});
  auto ref = std::dynamic_pointer_cast<EmptyLastImpl>(reference->clone());
  ref->zero_grad();
  for (int r = 0; r < W; ++r) (ref->forward(x.chunk(W)[r]).pow(2).mean() / W).backward();
  auto expected = grads_of(ref->parameters());
  Problems problems;
  run_thread_world(
      W,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<EmptyLastImpl>(reference->clone());
        DistributedDataParallel ddp(EmptyLast(model), world.group(),
                                    DistributedDataParallelOptions().bucket_cap_bytes(1).first_bucket_cap_bytes(1));
        for (int s = 0; s < 3; ++s) {
          ddp.module()->zero_grad();
          ddp(x.chunk(W)[world.rank()]).pow(2).mean().backward();
          double err = error_of(ddp.module()->parameters(), expected);
          problems.check(world.rank(), s, err);
        }
      },
      options());
  problems.report();
}

// ---------------------------------------------------------------------------
// Many steps at world 4 with 4 Gloo threads, and with 1 thread.
TEST(ManyStepsRide, WorldFourTwoHundredSteps) {
  for (int threads : {1, 4, 16}) {
    const int W = 4;
    torch::manual_seed(19);
    auto reference = cohort::testing::small_mlp();
    auto x = torch::randn({8, 6});
    auto ref = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
    ref->zero_grad();
    for (int r = 0; r < W; ++r) (ref->forward(x.chunk(W)[r]).pow(2).mean() / W).backward();
    auto expected = grads_of(ref->parameters());
    Problems problems;
    run_thread_world(
        W,
        [&](cohort::comm::World& world) {
          auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
          DistributedDataParallel ddp(torch::nn::Sequential(model), world.group(),
                                      DistributedDataParallelOptions().gradient_as_bucket_view(true).bucket_cap_bytes(1).first_bucket_cap_bytes(1));
          for (int s = 0; s < 200; ++s) {
            ddp.module()->zero_grad();
            ddp(x.chunk(W)[world.rank()]).pow(2).mean().backward();
            double err = error_of(ddp.module()->parameters(), expected);
            if (err > 1e-5) {
              problems.add("threads " + std::to_string(threads) + " rank " + std::to_string(world.rank()) +
                                 " step " + std::to_string(s) + " err " + std::to_string(err));
              break;
            }
          }
        },
        options().gloo_threads(threads));
    problems.report();
  }
}

// Forwards with grad enabled and no backward on every rank (find_unused, the last
// bucket unused), then ordinary steps.
TEST(AbandonRides, ForwardsWithoutBackwardOnEveryRankThenExactSteps) {
  const int W = 3;
  torch::manual_seed(20);
  UnusedLast reference;
  auto x = torch::randn({6, 6});
  auto ref = std::dynamic_pointer_cast<UnusedLastImpl>(reference->clone());
  ref->zero_grad();
  for (int r = 0; r < W; ++r) (ref->forward(x.chunk(W)[r], false).pow(2).mean() / W).backward();
  auto expected = grads_of(ref->parameters());
  Problems problems;
  run_thread_world(
      W,
      [&](cohort::comm::World& world) {
        auto model = std::dynamic_pointer_cast<UnusedLastImpl>(reference->clone());
        DistributedDataParallel ddp(UnusedLast(model), world.group(),
                                    DistributedDataParallelOptions().find_unused_parameters(true).bucket_cap_bytes(1).first_bucket_cap_bytes(1));
        for (int s = 0; s < 4; ++s) {
          if (s != 1) { auto ignored = ddp(x.chunk(W)[world.rank()], false); }
          ddp.module()->zero_grad();
          ddp(x.chunk(W)[world.rank()], false).pow(2).mean().backward();
          double err = error_of(ddp.module()->parameters(), expected);
          problems.check(world.rank(), s, err);
        }
      },
      options());
  problems.report();
}

TEST(GlooThreadsEnv, EdgeValues) {
  using cohort::comm::InitOptions;
  // 65 passes from_env, and is refused by validate().
  auto o = InitOptions::from_env({{"COHORT_GLOO_THREADS", "65"}});
  EXPECT_THROW(o.validate(), cohort::ConfigError);
  EXPECT_THROW(InitOptions::from_env({{"COHORT_GLOO_THREADS", "99999999999"}}), cohort::ConfigError);
  // Digits only: leading whitespace or a sign is refused; leading zeros are digits;
  // an empty value is unset (the default).
  for (const char* bad : {" 4", "+4", "4 ", "-0", "0x4", "1e1"})
    EXPECT_THROW(InitOptions::from_env({{"COHORT_GLOO_THREADS", bad}}), cohort::ConfigError) << "'" << bad << "'";
  EXPECT_EQ(InitOptions::from_env({{"COHORT_GLOO_THREADS", "04"}}).gloo_threads(), 4);
  EXPECT_EQ(InitOptions::from_env({{"COHORT_GLOO_THREADS", ""}}).gloo_threads(), InitOptions().gloo_threads());
}

}  // namespace
