// PowerSGD (Note [PowerSGD step]) on hand-made buckets, with ranks as threads:
// bitwise the plain all-reduce before its start iteration; the average within
// float32's rounding when the rank covers the matrices; nothing lost with error
// feedback (what was sent plus what is remembered is what came in); (n + m) * r
// elements sent per matrix; an overflowed step that leaves the memories as they
// were; and its state through a checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "cohort/ddp/comm_hook.h"
#include "cohort/ddp/powersgd_hook.h"
#include "cohort/errors.h"
#include "support/thread_world.h"

namespace {
using cohort::ddp::GradBucket;
using cohort::ddp::PowerSGDOptions;

// Shapes of one bucket's gradients: two matrices that compress, a bias that does not,
// and a 4-d tensor viewed as 8 x 9.
const std::vector<std::vector<std::int64_t>> kShapes = {{64, 32}, {16}, {8, 3, 3, 1}, {40, 24}};

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// Rank `rank`'s gradients of `step`, divided by the world size as DDP hands them in.
GradBucket make_bucket(int rank, int world, int step) {
  std::int64_t total = 0;
  for (const auto& s : kShapes) total += numel_of(s);
  torch::manual_seed(100 * step + rank);
  auto buffer = torch::randn({total}) / world;
  std::vector<torch::Tensor> views;
  std::int64_t offset = 0;
  for (const auto& s : kShapes) {
    views.push_back(buffer.narrow(0, offset, numel_of(s)).view(s));
    offset += numel_of(s);
  }
  return GradBucket(0, true, buffer, views, world);
}

// The buckets of every rank, made before the threads start (manual_seed is global).
std::vector<std::vector<GradBucket>> all_buckets(int world, int steps) {
  std::vector<std::vector<GradBucket>> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    for (int s = 0; s < steps; ++s) out[static_cast<std::size_t>(r)].push_back(make_bucket(r, world, s));
  return out;
}

// What float32 arithmetic can promise for results made by chains of `length`
// roundings (sums, products) of values up to `magnitude`: rounding errors add up as a
// random walk, about sqrt(length) * eps * magnitude; `slack` covers the constant and
// the order the BLAS kernel of the machine sums in (OPENBLAS_CORETYPE).
double float32_bound(double magnitude, double length, double slack = 4) {
  return slack * std::numeric_limits<float>::epsilon() * std::sqrt(length) * magnitude;
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

torch::Tensor reduce(cohort::ddp::CommHook& hook, cohort::comm::Group& group, GradBucket& bucket) {
  auto work = hook.start(group, bucket);
  work.wait();
  return bucket.buffer().clone();
}

TEST(PowerSgd, BeforeItsStartIterationItIsBitwiseThePlainAllReduce) {
  constexpr int kWorld = 3, kSteps = 4;
  auto mine = all_buckets(kWorld, kSteps), plain = all_buckets(kWorld, kSteps);
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    auto powersgd = cohort::ddp::powersgd_hook(PowerSGDOptions().start_powerSGD_iter(kSteps));
    auto all_reduce = cohort::ddp::all_reduce_hook();
    for (int s = 0; s < kSteps; ++s) {
      auto a = reduce(*powersgd, world.group(), mine[r][s]);
      auto b = reduce(*all_reduce, world.group(), plain[r][s]);
      EXPECT_TRUE(torch::equal(a, b)) << "step " << s;
      EXPECT_EQ(powersgd->last_step_traffic().compressed, 0);
    }
    EXPECT_EQ(powersgd->iteration(), kSteps);
  });
}

TEST(PowerSgd, WithARankThatCoversTheMatricesItIsTheAverage) {
  constexpr int kWorld = 2, kSteps = 6;
  auto mine = all_buckets(kWorld, kSteps), plain = all_buckets(kWorld, kSteps);
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    // r = 64 >= min(n, m) of every matrix; compressed however little it saves.
    // Error feedback on: each step's memory is what the next must make up for.
    auto powersgd = cohort::ddp::powersgd_hook(
        PowerSGDOptions().start_powerSGD_iter(2).matrix_approximation_rank(64).min_compression_rate(0));
    auto all_reduce = cohort::ddp::all_reduce_hook();
    // A compressed matrix goes through three products, of lengths m (M Q), n (M^T P)
    // and r (P Q^T): the longest chain of roundings any element sees.
    double length = 0;
    for (const auto& shape : kShapes) {
      if (shape.size() < 2) continue;
      const auto n = shape[0], m = numel_of(shape) / shape[0];
      length = std::max(length, static_cast<double>(n + m + std::min({n, m, std::int64_t{64}})));
    }
    for (int s = 0; s < kSteps; ++s) {
      auto a = reduce(*powersgd, world.group(), mine[r][s]);
      auto b = reduce(*all_reduce, world.group(), plain[r][s]);
      // (Once a fixed 1e-6, which one machine's BLAS missed by 10%.)
      EXPECT_LT(max_abs(a - b), float32_bound(max_abs(b), length)) << "step " << s;
      EXPECT_EQ(powersgd->last_step_traffic().compressed > 0, s >= 2) << "step " << s;
    }
  });
}

TEST(PowerSgd, ErrorFeedbackLosesNothingAndRankOneSendsNPlusMElements) {
  constexpr int kWorld = 2, kStart = 2, kSteps = 8;
  auto buckets = all_buckets(kWorld, kSteps);
  // What each rank hands in from the start iteration on, before the hook changes it.
  std::vector<torch::Tensor> inputs(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    inputs[r] = torch::zeros_like(buckets[r][0].buffer());
    for (int s = kStart; s < kSteps; ++s) inputs[r] += buckets[r][s].buffer();
  }
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    auto powersgd = cohort::ddp::powersgd_hook(PowerSGDOptions().start_powerSGD_iter(kStart));
    auto sent = torch::zeros_like(inputs[r]);
    for (int s = 0; s < kSteps; ++s) {
      auto out = reduce(*powersgd, world.group(), buckets[r][s]);
      if (s >= kStart) sent += out;
    }
    // In the bucket's divided units each step keeps e_t = (x_t + e_{t-1}) - out_t / N,
    // PyTorch's (g + e) - average: the averages taken and the last error add up to
    // what came in. Compression delays, never drops.
    // Kept per parameter: the bucket's four gradients, in order.
    std::vector<torch::Tensor> errors;
    for (std::size_t p = 0; p < kShapes.size(); ++p) {
      ASSERT_TRUE(powersgd->error_memory(p).defined()) << p;
      errors.push_back(powersgd->error_memory(p).reshape(-1));
    }
    auto error = torch::cat(errors);
    EXPECT_GT(error.abs().max().item<double>(), 1e-3) << "rank 1 cannot be exact here";
    // Each step rounds x + e and x - out / N once each, and the sums add one rounding
    // per step: about 3 roundings a step of values up to the sums' magnitude.
    const double magnitude = std::max({max_abs(sent / kWorld), max_abs(error), max_abs(inputs[r])});
    EXPECT_LT(max_abs(sent / kWorld + error - inputs[r]), float32_bound(magnitude, 3.0 * kSteps));
    // Rank 1: (64 + 32) + (8 + 9) + (40 + 24) elements; the bias whole.
    const auto& t = powersgd->last_step_traffic();
    EXPECT_EQ(t.compressed, (64 + 32) + (8 + 9) + (40 + 24));
    EXPECT_EQ(t.uncompressed, 16);
    EXPECT_EQ(t.dense, 64 * 32 + 16 + 72 + 40 * 24);
  });
}

// Note [Non-finite buckets]: an overflowed step (the GradScaler skips it) reaches
// every rank non-finite, and leaves the error memories and warm-start Qs as they
// were: the following steps are bitwise those of a hook that never saw it. (Before,
// the inf went into the memories and every later step came out NaN: with a
// GradScaler, every later step was skipped.)
TEST(PowerSgd, AnOverflowedStepLeavesTheMemoriesAsTheyWere) {
  constexpr int kWorld = 2, kSteps = 7;
  auto overflowing = all_buckets(kWorld, kSteps), reference = all_buckets(kWorld, kSteps);
  // Step 3: an inf in a compressed matrix of rank 0. Step 4: a NaN in rank 1's bias,
  // which travels whole.
  overflowing[0][3].gradients()[0][5][7] = std::numeric_limits<float>::infinity();
  overflowing[1][4].gradients()[1][2] = std::nan("");
  auto overflowed = [](int s) { return s == 3 || s == 4; };
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    const auto options = PowerSGDOptions().start_powerSGD_iter(2).matrix_approximation_rank(2);
    auto hook = cohort::ddp::powersgd_hook(options);
    auto clean = cohort::ddp::powersgd_hook(options);  // never sees the overflowed steps
    for (int s = 0; s < kSteps; ++s) {
      auto out = reduce(*hook, world.group(), overflowing[r][s]);
      if (overflowed(s)) {
        EXPECT_FALSE(out.isfinite().all().item<bool>()) << "step " << s << ": the scaler must see the overflow";
        continue;
      }
      auto expected = reduce(*clean, world.group(), reference[r][s]);
      EXPECT_TRUE(out.isfinite().all().item<bool>()) << "step " << s;
      EXPECT_TRUE(torch::equal(out, expected)) << "step " << s << ": max diff " << max_abs(out - expected);
    }
    for (std::size_t p = 0; p < kShapes.size(); ++p)
      EXPECT_TRUE(torch::equal(hook->error_memory(p), clean->error_memory(p))) << "parameter " << p;
  });
}

TEST(PowerSgd, MinCompressionRateDecidesWhatIsCompressed) {
  constexpr int kWorld = 2;
  auto buckets = all_buckets(kWorld, 3);
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    // r = 4: 64x32 sends 384 of 2048 (rate 5.3), 40x24 256 of 960 (3.75), 8x9 68 of 72.
    auto powersgd = cohort::ddp::powersgd_hook(
        PowerSGDOptions().start_powerSGD_iter(2).matrix_approximation_rank(4).min_compression_rate(4));
    for (int s = 0; s < 3; ++s) reduce(*powersgd, world.group(), buckets[r][s]);
    EXPECT_EQ(powersgd->last_step_traffic().compressed, (64 + 32) * 4);
    EXPECT_EQ(powersgd->last_step_traffic().uncompressed, 16 + 72 + 960);
  });
}

// A hook restored from another hook's state continues bitwise as the original does.
TEST(PowerSgd, ItsStateGoesThroughACheckpoint) {
  constexpr int kWorld = 2, kSteps = 5;
  auto straight = all_buckets(kWorld, kSteps), resumed = all_buckets(kWorld, kSteps);
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    const auto options = PowerSGDOptions().start_powerSGD_iter(2).random_seed(9);
    auto a = cohort::ddp::powersgd_hook(options);
    auto b = cohort::ddp::powersgd_hook(options);
    for (int s = 0; s < 3; ++s) {
      reduce(*a, world.group(), straight[r][s]);
      reduce(*b, world.group(), resumed[r][s]);
    }
    auto saved = b->state_dict(world.group());
    EXPECT_TRUE(saved.count("error.0.0") && saved.count("error.0.1") && saved.count("q.0") && saved.count("shape.3"));
    auto c = cohort::ddp::powersgd_hook(options);
    EXPECT_TRUE(c->load_state_dict(saved, world.group()));
    EXPECT_EQ(c->iteration(), 3);
    for (int s = 3; s < kSteps; ++s) {
      auto x = reduce(*a, world.group(), straight[r][s]);
      auto y = reduce(*c, world.group(), resumed[r][s]);
      EXPECT_TRUE(torch::equal(x, y)) << "step " << s;
    }
  });
}

TEST(PowerSgd, BadOptionsAreRefused) {
  EXPECT_THROW(cohort::ddp::powersgd_hook(PowerSGDOptions().matrix_approximation_rank(0)), cohort::ConfigError);
  EXPECT_THROW(cohort::ddp::powersgd_hook(PowerSGDOptions().min_compression_rate(-1)), cohort::ConfigError);
  // DDP rebuilds its buckets after the first step: memories need a later start.
  EXPECT_THROW(cohort::ddp::powersgd_hook(PowerSGDOptions().start_powerSGD_iter(1)), cohort::ConfigError);
  EXPECT_NO_THROW(cohort::ddp::powersgd_hook(
      PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false).warm_start(false)));
}

TEST(PowerSgd, OrthogonalizedColumnsAreOrthonormal) {
  torch::manual_seed(1);
  auto m = torch::randn({50, 4});
  cohort::ddp::orthogonalize_columns(m, 0);
  // Orthonormal in double, rounded to float32: m^T m is I up to the rounding of
  // dot products of length 50 of unit columns.
  EXPECT_LT(max_abs(torch::matmul(m.t(), m) - torch::eye(4)), float32_bound(1.0, 50));
  auto zero = torch::zeros({5, 2});
  cohort::ddp::orthogonalize_columns(zero, 0);
  EXPECT_FALSE(zero.isnan().any().item<bool>());
}

}  // namespace
