// Sharded checkpoints (Note [Sharded checkpoints], Note [Resharding]) with ranks as
// threads: each rank writes its own shard, a state saved at one world size loads
// at others exactly as the gathered whole state does, a missing or corrupt shard
// makes load_latest fall back naming the file, a plain optimizer is told to
// consolidate, and the consolidated file holds every state once.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/consolidate.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/compat/optimizer.h"
#include "cohort/errors.h"
#include "cohort/zero/sharded_optimizer.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace fs = std::filesystem;
using cohort::checkpoint::Checkpointer;
using cohort::checkpoint::CheckpointerOptions;
using cohort::testing::run_thread_world;
using cohort::zero::ShardedOptimizer;

namespace {

// Parameters of uneven sizes, so that worlds 2, 3 and 4 partition them differently.
// Seeding is process-wide and the ranks are threads: one model at a time.
torch::nn::Sequential make_model() {
  static std::mutex seeding;
  std::lock_guard<std::mutex> lock(seeding);
  torch::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(6, 40), torch::nn::Tanh(), torch::nn::Linear(40, 24),
                               torch::nn::Tanh(), torch::nn::Linear(24, 3));
}

cohort::zero::OptimizerFactory adam() {
  return [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2).weight_decay(1e-3));
  };
}

// The same batch on every rank (made before the threads start: seeding is global).
struct Batches {
  std::vector<torch::Tensor> x;
  explicit Batches(int n) {
    torch::manual_seed(5);
    for (int i = 0; i < n; ++i) x.push_back(torch::randn({8, 6}));
  }
};

void train(torch::nn::Sequential& model, torch::optim::Optimizer& opt, const Batches& b) {
  for (const auto& x : b.x) {
    opt.zero_grad();
    model->forward(x).pow(2).mean().backward();
    opt.step();
  }
}

CheckpointerOptions quiet(std::vector<std::string>* warnings = nullptr, std::mutex* m = nullptr) {
  return CheckpointerOptions().shard_optimizer_state(true).warn([=](const std::string& w) {
    if (!warnings) return;
    std::lock_guard<std::mutex> lock(*m);
    warnings->push_back(w);
  });
}

// Trains make_model() on `batches` with a sharded Adam on `world_size` ranks and
// saves it shard by shard into `dir` as step `step`; `then` runs on every rank after.
void save_sharded(const std::string& dir, int world_size, const Batches& batches, std::int64_t step,
                  const std::function<void(cohort::comm::World&, ShardedOptimizer&)>& then = nullptr) {
  run_thread_world(world_size, [&](cohort::comm::World& world) {
    auto model = make_model();
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    train(model, opt, batches);
    Checkpointer(dir, world.group(), quiet()).save(*model, opt, {step, 0, step, {}}, torch::kCPU);
    if (then) then(world, opt);
  });
}

// Adam's state of parameter i as (step, exp_avg, exp_avg_sq); step -1 when none.
struct AdamState {
  std::int64_t step = -1;
  torch::Tensor m, v;
};
AdamState state_of(const torch::optim::Optimizer* opt, const torch::Tensor& p) {
  if (opt == nullptr) return {};
  auto it = opt->state().find(cohort::compat::optimizer_state_key(p));
  if (it == opt->state().end()) return {};
  const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
  return {s.step(), s.exp_avg().clone(), s.exp_avg_sq().clone()};
}

// Every parameter's state, from the rank that owns it, gathered by running on
// every thread: states[i] is written by parameter i's owner.
struct Collected {
  std::mutex m;
  std::vector<AdamState> states;
  void take(const ShardedOptimizer& opt, const torch::nn::Sequential& model) {
    std::lock_guard<std::mutex> lock(m);
    const auto params = model->parameters();
    states.resize(params.size());
    auto& mutable_opt = const_cast<ShardedOptimizer&>(opt);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto s = state_of(mutable_opt.shard_optimizer(), params[i]);
      if (s.step >= 0) states[i] = s;
    }
  }
};

void expect_same(const std::vector<AdamState>& x, const std::vector<AdamState>& y, const std::string& what) {
  ASSERT_EQ(x.size(), y.size()) << what;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_GE(x[i].step, 0) << what << ": parameter " << i << " has no state";
    EXPECT_EQ(x[i].step, y[i].step) << what << ": parameter " << i;
    EXPECT_TRUE(torch::equal(x[i].m, y[i].m)) << what << ": parameter " << i;
    EXPECT_TRUE(torch::equal(x[i].v, y[i].v)) << what << ": parameter " << i;
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Bit 0 of the first `digit` from the first `after` on in the manifest of `step`: a
// digit becomes another (1 <-> 0), and the JSON stays valid.
void flip_digit_after(const std::string& step, const std::string& after, char digit) {
  const std::string path = step + "/" + cohort::checkpoint::kManifestName;
  std::string text = read_bytes(path);
  const auto at = text.find(after);
  ASSERT_NE(at, std::string::npos) << after;
  const auto i = text.find(digit, at);
  ASSERT_NE(i, std::string::npos) << after;
  text[i] = static_cast<char>(text[i] ^ 1);
  write_bytes(path, text);
}

bool same_manifest(const cohort::checkpoint::Manifest& a, const cohort::checkpoint::Manifest& b) {
  if (a.step != b.step || a.files.size() != b.files.size() || a.shards.has_value() != b.shards.has_value())
    return false;
  for (const auto& [name, entry] : a.files) {
    auto it = b.files.find(name);
    if (it == b.files.end() || it->second.bytes != entry.bytes || it->second.crc32 != entry.crc32) return false;
  }
  return !a.shards || (a.shards->files == b.shards->files && a.shards->layout.owner == b.shards->layout.owner &&
                       a.shards->layout.world_size == b.shards->layout.world_size);
}

}  // namespace

// Saved shard by shard at world 3; loaded at worlds 2 and 4 it equals, parameter by
// parameter, the state gathered whole at world 3 and loaded the old way.
TEST(ShardedCheckpoint, SavedAtThreeLoadsAtTwoAndFourAsTheWholeStateDoes) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string dir = temp.path + "/ckpt", whole = temp.path + "/whole.pt";
  save_sharded(dir, 3, Batches(3), 3, [&](cohort::comm::World& world, ShardedOptimizer& opt) {
    opt.gather_state(0);
    if (world.rank() == 0) torch::save(opt, whole);
    opt.release_gathered_state();
  });
  const std::string step = Checkpointer(dir, cohort::comm::Group()).path_of(3);
  EXPECT_FALSE(fs::exists(step + "/optimizer.pt"));
  for (int k = 0; k < 3; ++k)
    EXPECT_TRUE(fs::exists(step + "/" + cohort::checkpoint::shard_file_name(k, 3))) << k;
  const auto manifest = cohort::checkpoint::read_manifest(step, 3);
  ASSERT_TRUE(manifest.shards.has_value());
  EXPECT_EQ(manifest.shards->layout.world_size, 3);

  for (int world_size : {2, 4}) {
    Collected resharded, reference;
    run_thread_world(world_size, [&](cohort::comm::World& world) {
      auto model = make_model();
      ShardedOptimizer opt(model->parameters(), world.group(), adam());
      auto restored = Checkpointer(dir, world.group(), quiet()).load_latest(*model, opt, torch::kCPU);
      ASSERT_TRUE(restored.has_value());
      EXPECT_EQ(restored->progress.step, 3);
      resharded.take(opt, model);
      auto model2 = make_model();
      ShardedOptimizer opt2(model2->parameters(), world.group(), adam());
      torch::load(opt2, whole);
      reference.take(opt2, model2);
    });
    expect_same(resharded.states, reference.states, "world " + std::to_string(world_size));
  }
}

// Step 2's shard 1 removed, step 3's shard 0 damaged: load_latest falls back to
// step 1, each warning naming the shard's file, and moves the bad ones aside.
TEST(ShardedCheckpoint, AMissingOrCorruptShardFallsBackNamingIt) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string dir = temp.path + "/ckpt";
  const Batches batches(1);
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    Checkpointer ckpt(dir, world.group(), quiet());
    for (int s = 1; s <= 3; ++s) {
      train(model, opt, batches);
      ckpt.save(*model, opt, {s, 0, s, {}}, torch::kCPU);
    }
  });
  Checkpointer paths(dir, cohort::comm::Group());
  const auto shard1 = cohort::checkpoint::shard_file_name(1, 2), shard0 = cohort::checkpoint::shard_file_name(0, 2);
  fs::remove(paths.path_of(2) + "/" + shard1);
  {
    std::fstream f(paths.path_of(3) + "/" + shard0, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  std::vector<std::string> warnings;
  std::mutex m;
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    auto restored = Checkpointer(dir, world.group(), quiet(&warnings, &m)).load_latest(*model, opt, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    EXPECT_EQ(restored->progress.step, 1);
    // Rank 0 read shard 0 and rank 1 shard 1 of step 1: each holds its own states.
    EXPECT_GT(opt.local_state_bytes(), 0);
  });
  std::string all;
  for (const auto& w : warnings) all += w + "\n";
  EXPECT_NE(all.find(shard0 + " fails its CRC-32"), std::string::npos) << all;
  EXPECT_NE(all.find(shard1 + " is missing"), std::string::npos) << all;
  EXPECT_NE(all.find("falling back to the checkpoint " + paths.path_of(1)), std::string::npos) << all;
  EXPECT_EQ(paths.steps_on_disk(), std::vector<std::int64_t>{1});
}

// A plain optimizer is refused both ways, with the fix; a mismatched model too.
TEST(ShardedCheckpoint, APlainOptimizerIsToldToUseAShardedOneOrConsolidate) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string dir = temp.path + "/ckpt";
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::Adam plain(model->parameters(), torch::optim::AdamOptions(1e-2));
    try {
      Checkpointer(dir, world.group(), quiet()).save(*model, plain, {1, 0, 1, {}}, torch::kCPU);
      ADD_FAILURE() << "a plain optimizer was saved shard by shard";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("Leave the option off"), std::string::npos) << e.what();
    }
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    Checkpointer(dir, world.group(), quiet()).save(*model, opt, {1, 0, 1, {}}, torch::kCPU);
    // Note [Nothing changes until everything fits]: a refused load leaves the
    // model's weights as they were, not the checkpoint's.
    auto fresh = make_model();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : fresh->parameters()) p.fill_(0.25);
    }
    torch::optim::Adam fresh_plain(fresh->parameters(), torch::optim::AdamOptions(1e-2));
    try {
      Checkpointer(dir, world.group(), quiet()).load_latest(*fresh, fresh_plain, torch::kCPU);
      ADD_FAILURE() << "a sharded state was loaded into a plain optimizer";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("cohort checkpoint consolidate"), std::string::npos) << e.what();
    }
    auto sgd = [](std::vector<torch::Tensor> p) {
      return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
    };
    ShardedOptimizer fresh_sgd(fresh->parameters(), world.group(), sgd);
    EXPECT_THROW(Checkpointer(dir, world.group(), quiet()).load_latest(*fresh, fresh_sgd, torch::kCPU),
                 cohort::ConfigError);
    for (const auto& p : fresh->parameters()) EXPECT_TRUE(p.eq(0.25).all().item<bool>());
    // Another model: refused on every rank, the optimizer unchanged.
    torch::nn::Sequential other(torch::nn::Linear(6, 40), torch::nn::Linear(40, 3));
    ShardedOptimizer other_opt(other->parameters(), world.group(), adam());
    EXPECT_THROW(Checkpointer(dir, world.group(), quiet()).load_latest(*other, other_opt, torch::kCPU),
                 cohort::ConfigError);
    EXPECT_EQ(other_opt.local_state_bytes(), 0);
  });
}

// The consolidated file: the model as model.pt holds it, and each parameter's
// state once, under its index, equal to the whole optimizer's.
TEST(ShardedCheckpoint, TheConsolidatedFileHoldsEveryStateOnce) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string dir = temp.path + "/ckpt", out = temp.path + "/out.pt";
  const Batches batches(2);
  Collected whole;
  run_thread_world(3, [&](cohort::comm::World& world) {
    auto model = make_model();
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    train(model, opt, batches);
    opt.set_lr(0.05);  // as a scheduler does after step(): the file holds what is in force
    Checkpointer(dir, world.group(), quiet()).save(*model, opt, {2, 1, 2, {}}, torch::kCPU);
    whole.take(opt, model);
  });
  std::ostringstream log;
  const auto done = cohort::checkpoint::consolidate_checkpoint(dir, out, log);
  EXPECT_EQ(done.step, 2);
  EXPECT_EQ(done.shards, 3);
  EXPECT_EQ(done.parameters, 6);
  EXPECT_EQ(done.with_state, 6);
  std::ifstream in(out, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto root = cohort::checkpoint::torch_load_bytes(bytes, out).toGenericDict();
  EXPECT_EQ(root.at("step").toInt(), 2);
  EXPECT_EQ(root.at("epoch").toInt(), 1);
  const auto model = root.at("model").toGenericDict();
  const auto reference = make_model();
  EXPECT_EQ(model.size(), reference->named_parameters().size());
  const auto optimizer = root.at("optimizer").toGenericDict();
  const auto state = optimizer.at("state").toGenericDict();
  ASSERT_EQ(state.size(), 6u);
  for (std::int64_t i = 0; i < 6; ++i) {
    const auto s = state.at(i).toGenericDict();
    const auto& w = whole.states[static_cast<std::size_t>(i)];
    EXPECT_EQ(s.at("step").toInt(), w.step) << i;
    EXPECT_TRUE(torch::equal(s.at("exp_avg").toTensor(), w.m)) << i;
    EXPECT_TRUE(torch::equal(s.at("exp_avg_sq").toTensor(), w.v)) << i;
  }
  const auto groups = optimizer.at("param_groups").toList();
  ASSERT_EQ(groups.size(), 1u);
  const auto group = groups.get(0).toGenericDict();
  // Note [No floats for Python 1.13]: a 0-d float64 tensor.
  EXPECT_DOUBLE_EQ(group.at("lr").toTensor().item<double>(), 0.05);
  std::vector<std::int64_t> listed;
  const auto params = group.at("params").toList();
  for (std::size_t k = 0; k < params.size(); ++k) listed.push_back(params.get(k).toInt());
  EXPECT_EQ(listed, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));

  // A damaged shard: the tool names it and writes nothing.
  const std::string step = Checkpointer(dir, cohort::comm::Group()).path_of(2);
  const auto shard = step + "/" + cohort::checkpoint::shard_file_name(1, 3);
  fs::resize_file(shard, fs::file_size(shard) - 1);
  fs::remove(out);
  try {
    cohort::checkpoint::consolidate_checkpoint(step, out, log);
    ADD_FAILURE() << "a truncated shard was consolidated";
  } catch (const cohort::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(cohort::checkpoint::shard_file_name(1, 3)), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
  // Nor into the checkpoint it reads.
  EXPECT_THROW(cohort::checkpoint::consolidate_checkpoint(step, step + "/" + cohort::checkpoint::kManifestName, log),
               cohort::DataError);
}

// Steps past nine digits: the newest by number, as load_latest takes it.
TEST(ShardedCheckpoint, ConsolidateTakesTheNewestStepByNumber) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string dir = temp.path + "/ckpt";
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    Checkpointer ckpt(dir, world.group(), quiet());
    for (std::int64_t s : {999999999LL, 1000000000LL}) ckpt.save(*model, opt, {s, 0, 0, {}}, torch::kCPU);
  });
  std::ostringstream log;
  EXPECT_EQ(cohort::checkpoint::consolidate_checkpoint(dir, temp.path + "/out.pt", log).step, 1000000000);
}

// The learning rate after a sharded load is what a gathered load gives, on every
// rank: the one in force (LibTorch 1.13 restores no options) or the saved one.
TEST(ShardedCheckpoint, OptionsAfterALoadAreThoseOfAGatheredLoad) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string dir = temp.path + "/ckpt", whole = temp.path + "/whole.pt";
  const Batches batches(1);
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    train(model, opt, batches);
    opt.set_lr(0.05);
    Checkpointer(dir, world.group(), quiet()).save(*model, opt, {1, 0, 1, {}}, torch::kCPU);
    opt.gather_state(0);
    if (world.rank() == 0) torch::save(opt, whole);
    opt.release_gathered_state();
  });
  run_thread_world(6, [&](cohort::comm::World& world) {  // six parameters: one each
    auto model = make_model();
    ShardedOptimizer sharded(model->parameters(), world.group(), adam());
    sharded.set_lr(0.02);
    Checkpointer(dir, world.group(), quiet()).load_latest(*model, sharded, torch::kCPU);
    ShardedOptimizer gathered(model->parameters(), world.group(), adam());
    gathered.set_lr(0.02);
    torch::load(gathered, whole);
    EXPECT_DOUBLE_EQ(sharded.lr(), gathered.lr()) << "rank " << world.rank();
  });
}

// Note [The manifest's own checksum]: any digit of a manifest, sharded (world 3) or
// whole, turned into its neighbour (bit 0 flipped: an owner, a size, a CRC-32, a
// shard's number, the world size, the step) is refused as a DataError. Digits only:
// each refusal is a C++ exception, which costs milliseconds in a binary this big.
TEST(ShardedCheckpoint, AnyDigitOfTheManifestFlippedIsRefused) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string sharded = temp.path + "/sharded", whole = temp.path + "/whole";
  const Batches one(1);
  save_sharded(sharded, 3, one, 1);
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
    train(model, opt, one);
    Checkpointer(whole, world.group(), CheckpointerOptions()).save(*model, opt, {1, 0, 1, {}}, torch::kCPU);
  });
  for (const std::string& dir : {sharded, whole}) {
    const std::string step = Checkpointer(dir, cohort::comm::Group()).path_of(1);
    const std::string path = step + "/" + cohort::checkpoint::kManifestName;
    const std::string original = read_bytes(path);
    const auto reference = cohort::checkpoint::read_manifest(step, 1);
    int passed = 0;
    for (std::size_t i = 0; i < original.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(original[i]))) continue;
      std::string flipped = original;
      flipped[i] = static_cast<char>(flipped[i] ^ 1);
      write_bytes(path, flipped);
      try {
        const auto m = cohort::checkpoint::read_manifest(step, 1);
        ++passed;
        ADD_FAILURE() << dir << ": byte " << i << " ('" << original[i] << "') flipped was read as "
                      << (same_manifest(m, reference) ? "the same" : "another") << " manifest";
      } catch (const cohort::DataError& e) {
        ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(passed, 0) << dir;  // Note [The manifest's own checksum]: no digit is harmless
    write_bytes(path, original);
  }
}

// The reproduction of issue 29, item 12: one bit flipped in the owner list, in the
// list of shard files or in a shard's entry of the newest of two sharded
// checkpoints. load_latest falls back to the older one, naming the manifest;
// consolidate refuses the damaged one naming it, and takes the older one when given
// the directory.
TEST(ShardedCheckpoint, AFlippedBitInTheManifestFallsBackAndConsolidateRefuses) {
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string base = temp.path + "/base", out = temp.path + "/out.pt";
  const Batches batches(1);
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    ShardedOptimizer opt(model->parameters(), world.group(), adam());
    Checkpointer ckpt(base, world.group(), quiet());
    for (int s = 1; s <= 2; ++s) {
      train(model, opt, batches);
      ckpt.save(*model, opt, {s, 0, s, {}}, torch::kCPU);
    }
  });
  struct Variant {
    const char* name;
    std::string after;
    char digit;
  };
  const std::vector<Variant> variants = {
      {"owner", "\"owner\": [", '1'},
      {"files_list", "\"optimizer_shards\"", '1'},  // optimizer-shard-00001 becomes shard 00000
      {"files_entry", "\"optimizer-shard-00001", '1'},  // its size and CRC-32 now shard 0's key
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    const std::string dir = temp.path + "/" + v.name;
    fs::copy(base, dir, fs::copy_options::recursive);
    const std::string step2 = Checkpointer(dir, cohort::comm::Group()).path_of(2);
    const std::string manifest = step2 + "/" + cohort::checkpoint::kManifestName;
    flip_digit_after(step2, v.after, v.digit);
    std::ostringstream log;
    try {
      cohort::checkpoint::consolidate_checkpoint(step2, out, log);
      ADD_FAILURE() << "a damaged manifest was consolidated";
    } catch (const cohort::DataError& e) {
      EXPECT_NE(std::string(e.what()).find(manifest + " fails its own CRC-32"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(cohort::checkpoint::consolidate_checkpoint(dir, out, log).step, 1);
    EXPECT_NE(log.str().find(manifest), std::string::npos) << log.str();
    fs::remove(out);

    std::vector<std::string> warnings;
    std::mutex m;
    run_thread_world(2, [&](cohort::comm::World& world) {
      auto model = make_model();
      ShardedOptimizer opt(model->parameters(), world.group(), adam());
      auto restored = Checkpointer(dir, world.group(), quiet(&warnings, &m)).load_latest(*model, opt, torch::kCPU);
      ASSERT_TRUE(restored.has_value());
      EXPECT_EQ(restored->progress.step, 1);
    });
    std::string all;
    for (const auto& w : warnings) all += w + "\n";
    EXPECT_NE(all.find(manifest + " fails its own CRC-32"), std::string::npos) << all;
    EXPECT_NE(all.find("falling back to the checkpoint"), std::string::npos) << all;
  }
}

// Note [A consistent shard layout]: a manifest whose checksum holds (as a buggy or
// hand-made writer leaves it) but whose layout cannot be is refused, naming it.
TEST(ShardedCheckpoint, AnInconsistentManifestIsRefusedThoughItsChecksumHolds) {
  using cohort::checkpoint::Manifest;
  cohort::testing::TempDir temp("cohort-sharded");
  const std::string dir = temp.path + "/ckpt";
  save_sharded(dir, 3, Batches(1), 1);
  const std::string step = Checkpointer(dir, cohort::comm::Group()).path_of(1);
  const std::string path = step + "/" + cohort::checkpoint::kManifestName;
  const auto good = cohort::checkpoint::read_manifest(step, 1);
  ASSERT_EQ(good.shards->layout.owner.size(), 6u);
  const std::vector<std::pair<std::string, std::function<void(Manifest&)>>> variants = {
      {"it must be optimizer-shard-00000-of-00003.pt",
       [](Manifest& m) { std::swap(m.shards->files[0], m.shards->files[1]); }},
      {"it must be optimizer-shard-00001-of-00003.pt", [](Manifest& m) { m.shards->files[1] = m.shards->files[0]; }},
      {"is no shard of 3", [](Manifest& m) { m.shards->layout.owner[0] = 3; }},
      {"do not add up", [](Manifest& m) { m.shards->layout.world_size = 2; }},
      {"a shard is empty exactly when it owns none",
       [](Manifest& m) { std::fill(m.shards->layout.owner.begin(), m.shards->layout.owner.end(), 0); }},
      {"does not list the size and CRC-32 of its shard",
       [](Manifest& m) { m.files.erase(cohort::checkpoint::shard_file_name(2, 3)); }},
      {"which is no file name of a checkpoint", [](Manifest& m) { m.files["../model.pt"] = m.files["model.pt"]; }},
  };
  for (const auto& [expected, change] : variants) {
    Manifest m = good;
    change(m);
    write_bytes(path, cohort::checkpoint::manifest_json(m));
    try {
      cohort::checkpoint::read_manifest(step, 1);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const cohort::DataError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    std::ostringstream log;
    EXPECT_THROW(cohort::checkpoint::consolidate_checkpoint(step, temp.path + "/out.pt", log), cohort::DataError)
        << expected;
  }
}
