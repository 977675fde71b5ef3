// ZeRO-3 (zero/fully_shard.h) with ranks as threads: the sharded model trains as the
// same model unsharded does on the whole batch, holds 1/N of the parameters, frees
// what it gathers, and refuses what it cannot do. Real processes against DDP:
// tests/multiproc/zero_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <sstream>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/errors.h"
#include "cohort/recompute/checkpoint.h"
#include "cohort/zero/fully_shard.h"
#include "cohort/zero/fully_sharded_optimizer.h"
#include "cohort/compat/optimizer.h"
#include "cohort/zero/state_bytes.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"
#include "support/unused_parameters.h"

namespace {
using cohort::zero::FullyShard;
using cohort::zero::FullyShardOptions;

constexpr int kHidden = 8;

// tanh(x W^T + b); W may be shared with another block.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(torch::Tensor w) {
    weight = register_parameter("weight", std::move(w));
    bias = register_parameter("bias", torch::randn({kHidden}) * 0.1);
  }
  torch::Tensor forward(torch::Tensor x) { return torch::tanh(torch::addmm(bias, x, weight.t())); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Block);

// Two blocks that share one weight (so it belongs to the outer unit), a head, a
// trainable scale and a frozen offset in the outer unit itself.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool units, int hidden = kHidden) {
    auto shared = torch::randn({kHidden, hidden}) * 0.3;
    Block b1(shared), b2(shared);
    if (units) {
      u1 = register_module("b1", FullyShard<BlockImpl>(b1));
      u2 = register_module("b2", FullyShard<BlockImpl>(b2));
    } else {
      p1 = register_module("b1", b1);
      p2 = register_module("b2", b2);
    }
    head = register_module("head", torch::nn::Linear(kHidden, 3));
    scale = register_parameter("scale", torch::ones({3}));
    offset = register_parameter("offset", torch::full({3}, 0.5), /*requires_grad=*/false);
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = u1 ? u2(u1(x)) : p2(p1(x));
    return head(h) * scale + offset;
  }
  FullyShard<BlockImpl> u1{nullptr}, u2{nullptr};
  Block p1{nullptr}, p2{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor scale, offset;
};

// The same initial values for the sharded model and its unsharded reference.
struct Pair {
  FullyShard<NetImpl> sharded{nullptr};
  std::shared_ptr<NetImpl> reference;
};
Pair make_pair(int hidden = kHidden) {
  static std::mutex seeding;  // torch::manual_seed is process-wide
  std::lock_guard<std::mutex> lock(seeding);
  Pair p;
  torch::manual_seed(3);
  p.sharded = FullyShard<NetImpl>(std::make_shared<NetImpl>(true, hidden));
  torch::manual_seed(3);
  p.reference = std::make_shared<NetImpl>(false, hidden);
  return p;
}

struct Data {
  torch::Tensor x, y;
};
Data data(int rows, int seed) {
  static std::mutex seeding;
  std::lock_guard<std::mutex> lock(seeding);
  torch::manual_seed(seed);
  return {torch::randn({rows, kHidden}), torch::randn({rows, 3})};
}

torch::Tensor loss(const torch::Tensor& out, const torch::Tensor& y) {
  return torch::mse_loss(out.to(torch::kFloat), y);
}

// Each parameter once: parameters() lists the shared weight twice, and an
// optimizer given it twice would step it twice.
std::vector<torch::Tensor> unique_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters())
    if (std::none_of(out.begin(), out.end(), [&](const auto& q) { return q.is_same(p); })) out.push_back(p);
  return out;
}

// Rank r's rows of the batch.
Data slice(const Data& d, int rank, int world) {
  const auto rows = d.x.size(0) / world;
  return {d.x.narrow(0, rank * rows, rows), d.y.narrow(0, rank * rows, rows)};
}

void expect_close(cohort::zero::FullyShardedModel& sharded, torch::nn::Module& model, torch::nn::Module& reference,
                  double atol, const std::string& where) {
  auto full = sharded.full_parameters();
  auto mine = model.named_parameters();
  auto theirs = reference.named_parameters();
  ASSERT_EQ(mine.size(), theirs.size());
  for (const auto& p : theirs) {
    ASSERT_TRUE(mine.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::allclose(mine[p.key()], p.value(), 1e-5, atol))
        << where << ": " << p.key() << "\n" << mine[p.key()] << "\n" << p.value();
  }
}

// Adam, K steps, at worlds 2 and 3: the sharded model ends where one process
// training the unsharded model on the whole batch ends.
TEST(FullyShard, TrainsAsTheUnshardedModelOnTheWholeBatch) {
  for (int world_size : {2, 3}) {
    for (bool reshard : {true, false}) {
      const auto batch = data(6 * world_size, 7);
      cohort::testing::run_thread_world(world_size, [&](cohort::comm::World& world) {
        auto pair = make_pair();
        auto sharded =
            cohort::zero::fully_shard(pair.sharded, world.group(), FullyShardOptions().reshard_after_forward(reshard));
        torch::optim::Adam opt(sharded.parameters(), torch::optim::AdamOptions(0.05));
        torch::optim::Adam ref_opt(unique_parameters(*pair.reference), torch::optim::AdamOptions(0.05));
        const auto mine = slice(batch, world.rank(), world_size);
        for (int step = 0; step < 4; ++step) {
          opt.zero_grad();
          loss(pair.sharded(mine.x), mine.y).backward();
          opt.step();
          ref_opt.zero_grad();
          loss(pair.reference->forward(batch.x), batch.y).backward();
          ref_opt.step();
        }
        expect_close(sharded, *pair.sharded, *pair.reference, 1e-5,
                     "world " + std::to_string(world_size) + " reshard " + std::to_string(reshard));
        // The frozen offset never moved and never had a gradient.
        auto full = sharded.full_parameters();
        EXPECT_TRUE(torch::equal(pair.sharded->module()->offset, torch::full({3}, 0.5)));
      });
    }
  }
}

TEST(FullyShard, HoldsItsShareOfTheParametersAndFreesWhatItGathers) {
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    const auto& flats = sharded.schedule().flats();
    std::int64_t shards = 0;
    for (const auto& f : flats) shards += f->chunk_numel() * 4;
    // Units: the outer one (scale, head, the shared weight, and the frozen offset
    // apart), b1 (its bias) and b2 (its bias).
    EXPECT_EQ(sharded.schedule().units().size(), 3u);
    EXPECT_EQ(flats.size(), 4u);
    const auto total = sharded.total_parameters();
    EXPECT_EQ(total, kHidden * kHidden + 2 * kHidden + 3 * kHidden + 3 + 3 + 3);
    EXPECT_EQ(sharded.local_parameter_bytes(), shards);
    EXPECT_LE(shards, total * 4 / 2 + 4 * static_cast<std::int64_t>(flats.size()));
    for (const auto& p : pair.sharded->parameters()) {
      EXPECT_EQ(p.storage().nbytes(), 0u) << "not freed";
      EXPECT_EQ(p.numel(), 0) << "a freed parameter must not look readable";
    }
    // Reading a freed parameter is an error, not garbage.
    EXPECT_THROW(pair.sharded->module()->head(torch::ones({1, kHidden})), c10::Error);

    const auto d = slice(data(4, 1), world.rank(), 2);
    auto out = pair.sharded(d.x);
    // After the forward only the outer unit stays gathered (reshard_after_forward).
    std::int64_t outer = 0;
    for (auto f : sharded.schedule().units()[0].flats) outer += flats[f]->padded_numel() * 4;
    EXPECT_EQ(sharded.local_parameter_bytes(), shards + outer);
    loss(out, d.y).backward();
    EXPECT_EQ(sharded.local_parameter_bytes(), shards) << "a unit stayed gathered after the backward";
    EXPECT_EQ(sharded.local_gradient_bytes(), shards - flats[1]->chunk_numel() * 4)  // all but the frozen flat
        << "the sharded gradients are one chunk per trainable flat";
    for (const auto& p : pair.sharded->parameters()) EXPECT_FALSE(p.grad().defined()) << "an original got a .grad";
    {
      torch::NoGradGuard no_grad;
      pair.sharded(d.x);
      EXPECT_EQ(sharded.local_parameter_bytes(), shards) << "a forward without grad left a unit gathered";
    }
  });
}

// Accumulation: two micro-batches under no_sync and one synchronised equal the
// reference's three backwards; prefetch on or off changes nothing, bitwise.
TEST(FullyShard, NoSyncAccumulatesAndPrefetchChangesNothing) {
  const auto batch = data(12, 9);
  std::vector<std::vector<torch::Tensor>> results(2);
  for (bool prefetch : {true, false}) {
    std::mutex m;
    cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
      auto pair = make_pair();
      auto sharded = cohort::zero::fully_shard(pair.sharded, world.group(), FullyShardOptions().prefetch(prefetch));
      torch::optim::SGD opt(sharded.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      torch::optim::SGD ref_opt(unique_parameters(*pair.reference), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        ref_opt.zero_grad();
        for (int micro = 0; micro < 3; ++micro) {
          const auto part = Data{batch.x.narrow(0, micro * 4, 4), batch.y.narrow(0, micro * 4, 4)};
          const auto mine = slice(part, world.rank(), 2);
          if (micro < 2) {
            auto guard = sharded.no_sync();
            loss(pair.sharded(mine.x), mine.y).backward();
          } else {
            loss(pair.sharded(mine.x), mine.y).backward();
          }
          loss(pair.reference->forward(part.x), part.y).backward();
        }
        opt.step();
        ref_opt.step();
      }
      expect_close(sharded, *pair.sharded, *pair.reference, 1e-5, "no_sync");
      if (world.rank() == 0) {
        std::lock_guard<std::mutex> lock(m);
        for (const auto& p : sharded.parameters()) results[prefetch ? 0 : 1].push_back(p.detach().clone());
      }
    });
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (std::size_t i = 0; i < results[0].size(); ++i) EXPECT_TRUE(torch::equal(results[0][i], results[1][i]));
}

// As DDP does: every rank starts from rank 0's weights, whatever it built.
TEST(FullyShard, EveryRankStartsFromRankZerosWeights) {
  cohort::testing::run_thread_world(3, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    if (world.rank() != 0) {
      torch::NoGradGuard no_grad;
      for (auto& p : pair.sharded->parameters()) p.add_(world.rank());
    }
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    expect_close(sharded, *pair.sharded, *pair.reference, 0, "rank 0's weights");
  });
}

TEST(FullyShard, FullParametersReadAndWriteTheWholeModel) {
  cohort::testing::run_thread_world(3, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    {
      auto full = sharded.full_parameters(/*write_back=*/true);
      torch::NoGradGuard no_grad;
      for (auto& p : pair.sharded->parameters()) p.fill_(0.25);
    }
    for (auto& p : pair.reference->parameters()) p.detach().fill_(0.25);
    const auto d = data(3, 4);
    // The forward computes with the values written back.
    auto out = pair.sharded(d.x);
    EXPECT_TRUE(torch::allclose(out, pair.reference->forward(d.x))) << out;
    // Clipping sees the whole model's norm.
    loss(out, d.y).backward();
    loss(pair.reference->forward(d.x), d.y).backward();
    const double norm = sharded.clip_grad_norm(0.01);
    const double ref_norm = torch::nn::utils::clip_grad_norm_(unique_parameters(*pair.reference), 0.01);
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm);
  });
}

TEST(FullyShard, ComputesInParamDtypeAndStaysCloseToFloat32) {
  const auto batch = data(8, 5);
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    auto sharded = cohort::zero::fully_shard(
        pair.sharded, world.group(),
        FullyShardOptions().param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat32));
    for (const auto& p : sharded.parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
    torch::optim::SGD opt(sharded.parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ref_opt(unique_parameters(*pair.reference), torch::optim::SGDOptions(0.1));
    const auto mine = slice(batch, world.rank(), 2);
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      auto out = pair.sharded(mine.x);
      EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
      loss(out, mine.y).backward();
      for (const auto& p : sharded.parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
      opt.step();
      ref_opt.zero_grad();
      loss(pair.reference->forward(batch.x), batch.y).backward();
      ref_opt.step();
    }
    expect_close(sharded, *pair.sharded, *pair.reference, 2e-2, "bf16");
    // The whole model reads back in its own dtype.
    auto full = sharded.full_parameters();
    for (const auto& p : pair.sharded->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  });
}

cohort::zero::OptimizerFactory adam() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.05).amsgrad(true));
  };
}

std::string saved(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

// Note [ZeRO-3 optimizer state]: saved at world 2, the state is what one Adam over
// the unsharded model holds, bitwise; loaded at world 3, training goes on as the
// unsharded model's does.
TEST(FullyShard, OptimizerStateSavesWholeAndLoadsAtAnotherWorldSize) {
  const auto batch = data(12, 13);
  std::string whole_state;
  std::string reference_state;
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    cohort::zero::FullyShardedOptimizer opt(sharded, adam());
    torch::optim::Adam ref_opt(unique_parameters(*pair.reference), torch::optim::AdamOptions(0.05).amsgrad(true));
    const auto mine = slice(batch, world.rank(), 2);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      loss(pair.sharded(mine.x), mine.y).backward();
      opt.step();
      ref_opt.zero_grad();
      loss(pair.reference->forward(batch.x), batch.y).backward();
      ref_opt.step();
    }
    EXPECT_LT(opt.local_state_bytes(), cohort::zero::optimizer_state_bytes(ref_opt));
    opt.gather_state(0);
    if (world.rank() == 0) {
      whole_state = saved(opt);
      reference_state = saved(ref_opt);
    } else {
      EXPECT_THROW(saved(opt), cohort::ConfigError);
    }
    opt.release_gathered_state();
  });
  // The whole state loads into a plain Adam over the unsharded model, and holds
  // what the reference's does.
  {
    auto pair = make_pair();
    torch::optim::Adam plain(unique_parameters(*pair.reference), torch::optim::AdamOptions(0.05).amsgrad(true));
    torch::optim::Adam ref(unique_parameters(*pair.reference), torch::optim::AdamOptions(0.05).amsgrad(true));
    load(plain, whole_state);
    load(ref, reference_state);
    for (const auto& p : unique_parameters(*pair.reference)) {
      auto key = cohort::compat::optimizer_state_key(p);
      if (!p.requires_grad()) {
        EXPECT_EQ(plain.state().count(key), 0u) << "the frozen offset has no state";
        continue;
      }
      auto& a = static_cast<torch::optim::AdamParamState&>(*plain.state().at(key));
      auto& b = static_cast<torch::optim::AdamParamState&>(*ref.state().at(key));
      EXPECT_EQ(a.step(), b.step());
      EXPECT_TRUE(torch::allclose(a.exp_avg(), b.exp_avg(), 1e-5, 1e-7));
      EXPECT_TRUE(torch::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-5, 1e-9));
      EXPECT_TRUE(torch::allclose(a.max_exp_avg_sq(), b.max_exp_avg_sq(), 1e-5, 1e-9));
    }
  }
  // World 3 takes it back, with the weights the reference ended with.
  cohort::testing::run_thread_world(3, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    torch::optim::Adam ref_opt(unique_parameters(*pair.reference), torch::optim::AdamOptions(0.05).amsgrad(true));
    // The reference replays its three steps, then both take two more.
    for (int step = 0; step < 3; ++step) {
      ref_opt.zero_grad();
      loss(pair.reference->forward(batch.x), batch.y).backward();
      ref_opt.step();
    }
    {
      torch::NoGradGuard no_grad;
      auto mine = pair.sharded->named_parameters();
      for (const auto& p : pair.reference->named_parameters()) mine[p.key()].copy_(p.value());
    }
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    cohort::zero::FullyShardedOptimizer opt(sharded, adam());
    load(opt, whole_state);
    const auto mine = slice(batch, world.rank(), 3);
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      loss(pair.sharded(mine.x), mine.y).backward();
      opt.step();
      ref_opt.zero_grad();
      loss(pair.reference->forward(batch.x), batch.y).backward();
      ref_opt.step();
    }
    expect_close(sharded, *pair.sharded, *pair.reference, 1e-5, "resumed at world 3");
  });
}

// Two layers recomputed in backward (cohort::recompute::checkpoint), as units of a
// fully sharded model or plain.
struct SegmentNetImpl : torch::nn::Module {
  SegmentNetImpl(bool units, bool with_modules) : with_modules_(with_modules) {
    torch::nn::Linear a(kHidden, kHidden), b(kHidden, 3);
    if (units) {
      ua = register_module("a", FullyShard<torch::nn::LinearImpl>(a));
      ub = register_module("b", FullyShard<torch::nn::LinearImpl>(b));
    } else {
      pa = register_module("a", a);
      pb = register_module("b", b);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto segment = [this](const cohort::recompute::TensorList& in) {
      auto h = torch::tanh(ua ? ua(in[0]) : pa(in[0]));
      return cohort::recompute::TensorList{ub ? ub(h) : pb(h)};
    };
    auto options = cohort::recompute::CheckpointOptions();
    if (with_modules_) options.modules({ua ? ua->module() : pa.ptr()});
    return cohort::recompute::checkpoint(segment, {x}, options)[0];
  }
  bool with_modules_;
  FullyShard<torch::nn::LinearImpl> ua{nullptr}, ub{nullptr};
  torch::nn::Linear pa{nullptr}, pb{nullptr};
};

// Without .modules() the recomputation gathers the units again and ends where the
// unsharded model does; .modules() naming a unit's layer, whose parameters are
// empty outside the unit, is refused.
TEST(FullyShard, CheckpointedUnitsRecomputeAndModulesOfAUnitAreRefused) {
  const auto batch = data(8, 21);
  for (bool with_modules : {false, true}) {
    cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
      std::shared_ptr<SegmentNetImpl> reference;
      FullyShard<SegmentNetImpl> net{nullptr};
      {
        static std::mutex seeding;
        std::lock_guard<std::mutex> lock(seeding);
        torch::manual_seed(5);
        net = FullyShard<SegmentNetImpl>(std::make_shared<SegmentNetImpl>(true, with_modules));
        torch::manual_seed(5);
        reference = std::make_shared<SegmentNetImpl>(false, false);
      }
      auto sharded = cohort::zero::fully_shard(net, world.group());
      const auto mine = slice(batch, world.rank(), 2);
      if (with_modules) {
        try {
          net(mine.x);
          ADD_FAILURE() << "accepted";
        } catch (const cohort::ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("fully_shard"), std::string::npos) << e.what();
        }
        return;
      }
      torch::optim::SGD opt(sharded.parameters(), torch::optim::SGDOptions(0.1));
      torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1));
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        loss(net(mine.x), mine.y).backward();
        opt.step();
        ref_opt.zero_grad();
        loss(reference->forward(batch.x), batch.y).backward();
        ref_opt.step();
      }
      expect_close(sharded, *net, *reference, 1e-6, "recomputed");
    });
  }
}

// Three units; `c` runs only in training, and `a` returns its learned offset as is
// (a view of its own parameter, as a positional embedding is) added to its input.
struct TrainOnlyImpl : torch::nn::Module {
  struct OffsetImpl : torch::nn::Module {
    OffsetImpl() { offset = register_parameter("offset", torch::randn({kHidden}) * 0.1); }
    torch::Tensor forward(const torch::Tensor& x) { return offset.unsqueeze(0).expand({x.size(0), kHidden}); }
    torch::Tensor offset;
  };
  explicit TrainOnlyImpl(bool units) {
    auto offset = std::make_shared<OffsetImpl>();
    torch::nn::Linear b(kHidden, kHidden), c(kHidden, 3);
    if (units) {
      ua = register_module("a", FullyShard<OffsetImpl>(offset));
      ub = register_module("b", FullyShard<torch::nn::LinearImpl>(b));
      uc = register_module("c", FullyShard<torch::nn::LinearImpl>(c));
    } else {
      pa = register_module("a", offset);
      pb = register_module("b", b);
      pc = register_module("c", c);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(x + (ua ? ua(x) : pa->forward(x)));
    if (is_training()) h = torch::tanh(ub ? ub(h) : pb(h));
    return uc ? uc(h) : pc(h);
  }
  FullyShard<OffsetImpl> ua{nullptr};
  FullyShard<torch::nn::LinearImpl> ub{nullptr}, uc{nullptr};
  std::shared_ptr<OffsetImpl> pa;
  torch::nn::Linear pb{nullptr}, pc{nullptr};
};

// Found by review: an evaluation forward between steps left `b` (which runs only
// in training) prefetched before the optimizer's step, and the next step computed
// with its old values; a unit's output that viewed its own freed parameter read
// freed memory; a no_sync sum survived zero_grad().
TEST(FullyShard, PrefetchesAcrossAStepViewsOfParametersAndClearedNoSyncSumsAreRight) {
  const auto batch = data(12, 17);
  for (bool plain_optimizer : {false, true})
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    FullyShard<TrainOnlyImpl> net{nullptr};
    std::shared_ptr<TrainOnlyImpl> reference;
    {
      static std::mutex seeding;
      std::lock_guard<std::mutex> lock(seeding);
      torch::manual_seed(8);
      net = FullyShard<TrainOnlyImpl>(std::make_shared<TrainOnlyImpl>(true));
      torch::manual_seed(8);
      reference = std::make_shared<TrainOnlyImpl>(false);
    }
    auto sharded = cohort::zero::fully_shard(net, world.group());
    // FullyShardedOptimizer marks what is gathered stale when it steps; under a
    // plain optimizer the outermost unit's next forward does (Note [Fresh gathers]).
    cohort::zero::OptimizerFactory sgd = [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.2));
    };
    std::unique_ptr<torch::optim::Optimizer> optimizer =
        plain_optimizer ? sgd(sharded.parameters()) : std::make_unique<cohort::zero::FullyShardedOptimizer>(sharded, sgd);
    auto& opt = *optimizer;
    torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.2));
    const auto mine = slice(batch, world.rank(), 2);
    for (int step = 0; step < 4; ++step) {
      if (step == 0) {  // a micro-batch then thrown away
        auto guard = sharded.no_sync();
        loss(net(mine.x * 3), mine.y).backward();
      }
      opt.zero_grad();
      loss(net(mine.x), mine.y).backward();
      {
        net->eval();
        torch::NoGradGuard no_grad;
        net(mine.x);  // prefetches `b`, which this forward does not run
        net->train();
      }
      opt.step();
      ref_opt.zero_grad();
      loss(reference->forward(batch.x), batch.y).backward();
      ref_opt.step();
    }
    expect_close(sharded, *net, *reference, 1e-6, plain_optimizer ? "plain optimizer" : "FullyShardedOptimizer");
  });
}

// torch::load gives each parameter new storage (set_); inside
// full_parameters(write_back) that still reaches the shards.
TEST(FullyShard, TorchLoadInsideFullParametersReachesTheShards) {
  cohort::testing::TempDir dir;
  const auto file = dir.path + "/model.pt";
  {
    auto pair = make_pair();
    torch::NoGradGuard no_grad;
    for (auto& p : pair.reference->parameters()) p.mul_(-2);
    torch::save(pair.reference, file);
  }
  const auto d = data(4, 3);
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : pair.reference->parameters()) p.mul_(-2);
    }
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    {
      auto full = sharded.full_parameters(/*write_back=*/true);
      torch::load(pair.sharded, file);
    }
    EXPECT_TRUE(torch::allclose(pair.sharded(d.x), pair.reference->forward(d.x)));
  });
}

TEST(FullyShard, ShardingTwiceAndParamDtypeOverFloatBuffersAreRefused) {
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    try {
      cohort::zero::fully_shard(pair.sharded, world.group());
      ADD_FAILURE() << "sharded twice";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("already fully sharded"), std::string::npos) << e.what();
    }
    FullyShard<torch::nn::BatchNorm1dImpl> norm(torch::nn::BatchNorm1d(4));
    try {
      cohort::zero::fully_shard(norm, world.group(),
                                FullyShardOptions().param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat32));
      ADD_FAILURE() << "param_dtype over BatchNorm's statistics";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("autocast"), std::string::npos) << e.what();
    }
  });
}

TEST(FullyShard, BFloat16ReductionsOverGlooAreRefusedWithTheFix) {
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    try {
      cohort::zero::fully_shard(pair.sharded, world.group(), FullyShardOptions().param_dtype(torch::kBFloat16));
      ADD_FAILURE() << "accepted";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("reduce_dtype(torch::kFloat32)"), std::string::npos) << e.what();
    }
  });
}

TEST(FullyShard, RanksWithDifferentModelsAreRefusedOnEveryRank) {
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair(world.rank() == 0 ? kHidden : kHidden + 1);
    try {
      cohort::zero::fully_shard(pair.sharded, world.group());
      ADD_FAILURE() << "rank " << world.rank() << " accepted a different model";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("b1.weight"), std::string::npos) << e.what();
    }
  });
}

// Note [Unused parameters under ZeRO-3]: body, head, `aux` (never used) and `late`
// (used from step 2) are units of their own (every rank runs the same units); the
// outer unit's flat is [scale (used), spare (never used), tilt (used by rank 0
// only)], and at world 2 tilt lies in rank 1's chunk: the ranks must agree.
struct UnusedNetImpl : torch::nn::Module {
  explicit UnusedNetImpl(bool units) {
    torch::nn::Linear body(6, 8), head(8, 3), aux(8, 3), late(8, 3);
    if (units) {
      ub = register_module("body", FullyShard<torch::nn::LinearImpl>(body));
      uh = register_module("head", FullyShard<torch::nn::LinearImpl>(head));
      ua = register_module("aux", FullyShard<torch::nn::LinearImpl>(aux));
      ul = register_module("late", FullyShard<torch::nn::LinearImpl>(late));
    } else {
      pb = register_module("body", body);
      ph = register_module("head", head);
      pa = register_module("aux", aux);
      pl = register_module("late", late);
    }
    scale = register_parameter("scale", torch::ones({3}));
    spare = register_parameter("spare", torch::randn({5}));
    tilt = register_parameter("tilt", torch::randn({4}));
  }
  torch::Tensor forward(torch::Tensor x) {
    const bool u = static_cast<bool>(ub);
    auto h = torch::tanh(u ? ub(x) : pb(x));
    auto out = (u ? uh(h) : ph(h)) * scale;
    if (use_late) out = out + (u ? ul(h) : pl(h));
    if (use_tilt) out = out + tilt.sum() * 0.1;
    return out;
  }
  bool use_late = false, use_tilt = false;
  FullyShard<torch::nn::LinearImpl> ub{nullptr}, uh{nullptr}, ua{nullptr}, ul{nullptr};
  torch::nn::Linear pb{nullptr}, ph{nullptr}, pa{nullptr}, pl{nullptr};
  torch::Tensor scale, spare, tilt;
};

using cohort::testing::adamw;

TEST(FullyShard, AParameterNoRankUsedIsSkippedAsInOneProcess) {
  constexpr int kWorld = 2, kRows = 3, kSteps = 4;
  const cohort::testing::StepBatches batches(kSteps, kWorld, kRows);
  // One process: the mean of the ranks' losses, one AdamW over every parameter.
  torch::manual_seed(1);
  auto ref = std::make_shared<UnusedNetImpl>(false);
  auto opt = adamw(ref->parameters());
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    torch::Tensor total = torch::zeros({});
    ref->use_late = s >= 2;
    for (int r = 0; r < kWorld; ++r) {
      ref->use_tilt = r == 0;
      total = total + torch::mse_loss(ref->forward(batches.x(s, r)), batches.y(s, r)) / kWorld;
    }
    total.backward();
    opt->step();
  }
  std::vector<std::shared_ptr<UnusedNetImpl>> nets;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(1);
    nets.push_back(std::make_shared<UnusedNetImpl>(true));
  }
  cohort::testing::run_thread_world(kWorld, [&](cohort::comm::World& world) {
    const int r = world.rank();
    FullyShard<UnusedNetImpl> root(nets[r]);
    auto sharded = cohort::zero::fully_shard(root, world.group());
    cohort::zero::FullyShardedOptimizer o(sharded, adamw);
    for (int s = 0; s < kSteps; ++s) {
      nets[r]->use_late = s >= 2;
      nets[r]->use_tilt = r == 0;
      o.zero_grad();
      torch::mse_loss(root(batches.x(s, r)), batches.y(s, r)).backward();
      o.step();
    }
    auto full = sharded.full_parameters();
    for (const auto& p : ref->named_parameters()) {
      const auto mine = nets[r]->named_parameters()[p.key()];
      EXPECT_TRUE(torch::allclose(mine, p.value(), 1e-5, 1e-6))
          << p.key() << " on rank " << r << " differs from one process by "
          << (mine - p.value()).abs().max().item<double>();
    }
  });
}

// Note [Unused parameters under ZeRO-3]: a parameter frozen at fully_shard() lives
// in a flat without gradients; unfreezing it later is refused, freezing is not.
TEST(FullyShard, UnfreezingAfterFullyShardIsRefused) {
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    torch::manual_seed(1);
    auto net = std::make_shared<UnusedNetImpl>(true);
    for (auto& p : net->ub->parameters()) p.set_requires_grad(false);
    FullyShard<UnusedNetImpl> root(net);
    auto sharded = cohort::zero::fully_shard(root, world.group());
    cohort::zero::FullyShardedOptimizer o(sharded, adamw);
    auto x = torch::full({3, 6}, world.rank() + 1.0);
    root(x).sum().backward();
    o.step();
    for (auto& p : net->ub->parameters()) p.set_requires_grad(true);
    try {
      root(x).sum().backward();
      ADD_FAILURE() << "a parameter unfrozen after fully_shard() was silently left frozen";
    } catch (const cohort::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'body.weight' was frozen"), std::string::npos) << what;
      EXPECT_NE(what.find("before fully_shard()"), std::string::npos) << what;
    }
    EXPECT_THROW(o.step(), cohort::ConfigError);
    for (auto& p : net->ub->parameters()) p.set_requires_grad(false);
    net->scale.set_requires_grad(false);  // freezing a trainable one is fine
    EXPECT_NO_THROW(root(x).sum().backward());
    EXPECT_NO_THROW(o.step());
  });
}

// A checkpoint saved outside full_parameters() would hold an empty model: refused
// on every rank, and nothing is written.
TEST(FullyShard, SavingOutsideFullParametersIsRefused) {
  cohort::testing::TempDir dir;
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    cohort::zero::FullyShardedOptimizer o(sharded, adamw);
    cohort::checkpoint::Checkpointer ckpt(dir.path, world.group(),
                                          cohort::checkpoint::CheckpointerOptions().warn([](const std::string&) {}));
    cohort::checkpoint::TrainingProgress progress;
    progress.step = 1;
    try {
      ckpt.save(*pair.sharded, o, progress, torch::kCPU);
      ADD_FAILURE() << "saved a fully sharded model outside full_parameters()";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("outside full_parameters()"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(ckpt.steps_on_disk().empty());
    {
      auto full = sharded.full_parameters();
      EXPECT_NO_THROW(ckpt.save(*pair.sharded, o, progress, torch::kCPU));
    }
  });
}

// Note [Leaving full_parameters()]: a file of another model inside
// full_parameters(true) neither ends the process (a throwing destructor) nor
// writes part of it back; close() throws it, and without close() the next forward does.
TEST(FullyShard, AFailedWriteBackThrowsFromCloseOrTheNextForwardNotTheDestructor) {
  cohort::testing::TempDir dir;
  const auto file = dir.path + "/wider.pt";
  torch::save(make_pair(/*hidden=*/16).reference, file);
  const auto d = data(4, 3);
  cohort::testing::run_thread_world(2, [&](cohort::comm::World& world) {
    auto pair = make_pair();
    auto sharded = cohort::zero::fully_shard(pair.sharded, world.group());
    const auto before = pair.reference->forward(d.x);
    {
      auto full = sharded.full_parameters(/*write_back=*/true);
      torch::load(pair.sharded, file);
      EXPECT_THROW(full.close(), cohort::ConfigError);
    }
    EXPECT_TRUE(torch::allclose(pair.sharded(d.x), before)) << "part of another model was written back";
    {
      auto full = sharded.full_parameters(/*write_back=*/true);
      torch::load(pair.sharded, file);
    }  // no close(): the destructor reports, and must not throw
    try {
      pair.sharded(d.x);
      ADD_FAILURE() << "the failed write-back went unreported";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("load a state of the same model"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(torch::allclose(pair.sharded(d.x), before));  // reported once; the old values stay
  });
}

}  // namespace
