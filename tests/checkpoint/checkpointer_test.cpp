// Checkpoints: round trip, keeping the last K, falling back past damaged ones, a
// model that does not fit, and ranks as threads (rank 0 writes, every rank loads).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>

#include <signal.h>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/state_dict.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/errors.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace fs = std::filesystem;
using namespace cohort::checkpoint;
using cohort::testing::run_thread_world;
using cohort::testing::TempDir;

namespace {

torch::nn::Sequential make_model(int hidden = 8) {
  return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::ReLU(),
                               torch::nn::Linear(hidden, 3));
}

void train_steps(torch::nn::Sequential& model, torch::optim::Optimizer& opt, int steps) {
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    model->forward(torch::randn({5, 4})).pow(2).sum().backward();
    opt.step();
  }
}

bool same_parameters(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    if (!torch::equal(pa[i], pb[i])) return false;
  }
  return true;
}

cohort::data::SamplerState some_sampler_state() {
  cohort::data::SamplerState s;
  s.seed = 0xfedcba9876543210ULL;  // above 2^63: travels as a bit pattern
  s.shuffle = true;
  s.epoch = 3;
  s.dataset_size = 1000;
  s.consumed = 384;
  return s;
}

struct Warnings {
  std::vector<std::string> seen;
  CheckpointerOptions options(int keep = 3) {
    return CheckpointerOptions().keep_last(keep).warn([this](const std::string& w) { seen.push_back(w); });
  }
};

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

}  // namespace

TEST(Checkpointer, RoundTripRestoresEverything) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  run_thread_world(1, [&](cohort::comm::World& world) {
    torch::manual_seed(1);
    auto model = make_model();
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
    train_steps(model, opt, 3);
    Checkpointer ckpt(dir, world.group());
    TrainingProgress progress{42, 3, 17, some_sampler_state()};
    const auto path = ckpt.save(*model, opt, progress, torch::kCPU);
    EXPECT_EQ(path, dir + "/step-000000042");
    const auto after_save = torch::rand({4});  // the generator's next draws

    torch::manual_seed(99);  // a different fresh process
    auto restored_model = make_model();
    torch::optim::Adam restored_opt(restored_model->parameters(), torch::optim::AdamOptions(1e-2));
    auto restored = ckpt.load_latest(*restored_model, restored_opt, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    EXPECT_EQ(restored->path, path);
    EXPECT_EQ(restored->progress.step, 42);
    EXPECT_EQ(restored->progress.epoch, 3);
    EXPECT_EQ(restored->progress.epoch_step, 17);
    ASSERT_TRUE(restored->progress.sampler.has_value());
    EXPECT_EQ(restored->progress.sampler->seed, 0xfedcba9876543210ULL);
    EXPECT_EQ(restored->progress.sampler->consumed, 384);
    EXPECT_EQ(restored->progress.sampler->dataset_size, 1000);
    EXPECT_EQ(restored->progress.sampler->epoch, 3);
    EXPECT_TRUE(restored->rng_restored);
    EXPECT_TRUE(torch::equal(torch::rand({4}), after_save));
    EXPECT_TRUE(same_parameters(*model, *restored_model));
    // Adam's moments and step counts came back: the same next steps give the same weights.
    torch::manual_seed(7);
    train_steps(model, opt, 2);
    torch::manual_seed(7);
    train_steps(restored_model, restored_opt, 2);
    EXPECT_TRUE(same_parameters(*model, *restored_model));
  });
}

TEST(Checkpointer, NothingToLoad) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), 0.1);
    Checkpointer ckpt(dir + "/not-yet", world.group());
    EXPECT_FALSE(ckpt.load_latest(*model, opt, torch::kCPU).has_value());
  });
}

TEST(Checkpointer, KeepsTheLastKAndClearsLeftovers) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  fs::create_directories(dir + "/.tmp-step-000000005.999");  // a dead writer's
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), 0.1);
    Warnings w;
    Checkpointer ckpt(dir, world.group(), w.options(2));
    for (int step = 10; step <= 50; step += 10) ckpt.save(*model, opt, {step, 0, 0, {}}, torch::kCPU);
    EXPECT_EQ(ckpt.steps_on_disk(), (std::vector<std::int64_t>{40, 50}));
    // Saving a step again (a resumed run) replaces it.
    ckpt.save(*model, opt, {50, 1, 0, {}}, torch::kCPU);
    EXPECT_EQ(ckpt.steps_on_disk(), (std::vector<std::int64_t>{40, 50}));
    EXPECT_EQ(ckpt.load_latest(*model, opt, torch::kCPU)->progress.epoch, 1);
  });
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
  }
}

namespace {

// Saves steps 10, 20, 30, each with every weight equal to its step, damages step 30
// with `damage`, and returns what load_latest found plus the warnings.
std::pair<std::int64_t, std::string> load_after_damage(const std::function<void(const std::string&)>& damage) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  std::int64_t loaded = -1;
  Warnings w;
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    Checkpointer ckpt(dir, world.group(), w.options(3));
    for (int step = 10; step <= 30; step += 10) {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.fill_(step);
      ckpt.save(*model, opt, {step, 0, 0, {}}, torch::kCPU);
    }
    damage(ckpt.path_of(30));
    auto fresh = make_model();
    torch::optim::SGD fresh_opt(fresh->parameters(), 0.1);
    auto restored = ckpt.load_latest(*fresh, fresh_opt, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    loaded = restored->progress.step;
    for (auto& p : fresh->parameters()) EXPECT_TRUE(p.eq(static_cast<double>(loaded)).all().item<bool>());
  });
  return {loaded, joined(w.seen)};
}

}  // namespace

TEST(Checkpointer, FallsBackPastATruncatedCheckpoint) {
  auto [step, warnings] = load_after_damage([](const std::string& path) {
    fs::resize_file(path + "/model.pt", fs::file_size(path + "/model.pt") / 2);
  });
  EXPECT_EQ(step, 20);
  EXPECT_NE(warnings.find("step-000000030/model.pt"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("truncated"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("falling back to the checkpoint"), std::string::npos) << warnings;
}

TEST(Checkpointer, FallsBackPastAFlippedBit) {
  for (const char* file : {"model.pt", "optimizer.pt", "trainer.pt"}) {
    auto [step, warnings] = load_after_damage([file](const std::string& path) {
      std::fstream f(path + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(100);
      char c;
      f.get(c);
      f.seekp(100);
      f.put(static_cast<char>(c ^ 0x04));
    });
    EXPECT_EQ(step, 20) << file;
    EXPECT_NE(warnings.find(std::string(file) + " fails its CRC-32"), std::string::npos) << warnings;
  }
}

TEST(Checkpointer, FallsBackPastAMissingManifest) {
  auto [step, warnings] = load_after_damage([](const std::string& path) { fs::remove(path + "/MANIFEST.json"); });
  EXPECT_EQ(step, 20);
  EXPECT_NE(warnings.find("MANIFEST.json"), std::string::npos) << warnings;
}

TEST(Checkpointer, FallsBackPastAManifestOfTheWrongShape) {
  auto [step, warnings] = load_after_damage([](const std::string& path) {
    std::ofstream(path + "/MANIFEST.json") << R"({"format": "cohort-checkpoint", "version": 1, "step": 30, "files": 5})";
  });
  EXPECT_EQ(step, 20);
  EXPECT_NE(warnings.find("step-000000030"), std::string::npos) << warnings;
}

// Rewrites path's manifest without its own checksum, as `version`.
void without_checksum(const std::string& path, const std::string& version) {
  std::string text = read_whole_file(path + "/MANIFEST.json");
  const auto field = text.find("\"manifest_crc32\"");
  ASSERT_NE(field, std::string::npos) << text;
  const auto line = text.rfind('\n', field);
  text.erase(line, text.find('\n', field) - line);
  const auto v = text.find("\"version\": 2");
  ASSERT_NE(v, std::string::npos) << text;
  text.replace(v, std::string("\"version\": 2").size(), "\"version\": " + version);
  write_file_atomically(path + "/MANIFEST.json", text);
}

// Note [The manifest's own checksum]: a manifest written before it had one (version
// 1) still loads; a version-2 manifest that lost it does not.
TEST(Checkpointer, AVersionOneManifestWithoutItsOwnChecksumStillLoads) {
  auto old = load_after_damage([&](const std::string& path) { without_checksum(path, "1"); });
  EXPECT_EQ(old.first, 30) << old.second;
  EXPECT_EQ(old.second, "");
  auto stripped = load_after_damage([&](const std::string& path) { without_checksum(path, "2"); });
  EXPECT_EQ(stripped.first, 20);
  EXPECT_NE(stripped.second.find("step-000000030/MANIFEST.json has no manifest_crc32"), std::string::npos)
      << stripped.second;
}

// Note [Integers from JSON]: a version-1 manifest (no checksum of its own) whose
// model.pt CRC-32 is a float was undefined behaviour (fuzz_checkpoint_manifest under
// UBSan), and one that is the right CRC-32 plus 2^32 was cut down to the right one,
// so the damaged manifest passed. Both are damage now: the older checkpoint loads.
TEST(Checkpointer, AManifestNumberThatIsNoExactIntegerIsDamage) {
  auto crc_becomes = [](const std::function<std::string(std::uint64_t)>& replace) {
    return load_after_damage([&](const std::string& path) {
      without_checksum(path, "1");
      std::string text = read_whole_file(path + "/MANIFEST.json");
      const auto at = text.find("\"crc32\": ", text.find("\"model.pt\""));
      ASSERT_NE(at, std::string::npos) << text;
      const auto digits = at + std::string("\"crc32\": ").size();
      const auto end = text.find_first_not_of("0123456789", digits);
      const std::uint64_t crc = std::stoull(text.substr(digits, end - digits));
      text.replace(digits, end - digits, replace(crc));
      write_file_atomically(path + "/MANIFEST.json", text);
    });
  };
  for (const auto& [what, replace] :
       std::vector<std::pair<std::string, std::function<std::string(std::uint64_t)>>>{
           {"a float", [](std::uint64_t) { return std::string("2e72"); }},
           {"2^32 more", [](std::uint64_t crc) { return std::to_string(crc + (std::uint64_t{1} << 32)); }},
           {"negative", [](std::uint64_t crc) { return "-" + std::to_string(crc); }}}) {
    const auto [step, warnings] = crc_becomes(replace);
    EXPECT_EQ(step, 20) << what << ": " << warnings;
    EXPECT_NE(warnings.find("step-000000030/MANIFEST.json"), std::string::npos) << what << ": " << warnings;
  }
  // The control: the same edit keeping the number loads the newest.
  EXPECT_EQ(crc_becomes([](std::uint64_t crc) { return std::to_string(crc); }).first, 30);
}

TEST(Checkpointer, ANewSaveAfterAFallbackIsKeptAndTheCorruptStepIsSetAside) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), 0.1);
    Warnings w;
    Checkpointer ckpt(dir, world.group(), w.options(1));
    ckpt.save(*model, opt, {200, 0, 0, {}}, torch::kCPU);
    // A newer checkpoint of an abandoned run, damaged: loading falls back to 200 ...
    fs::create_directories(ckpt.path_of(300));
    ASSERT_EQ(ckpt.load_latest(*model, opt, torch::kCPU)->progress.step, 200);
    // ... and the next save, 250, is the one kept, not the abandoned 300.
    ckpt.save(*model, opt, {250, 0, 0, {}}, torch::kCPU);
    EXPECT_EQ(ckpt.steps_on_disk(), (std::vector<std::int64_t>{250}));
    EXPECT_EQ(ckpt.load_latest(*model, opt, torch::kCPU)->progress.step, 250);
    // The corrupt one keeps its bytes under a name that is no longer a step.
    EXPECT_TRUE(fs::is_directory(dir + "/corrupt-step-000000300"));
    EXPECT_NE(joined(w.seen).find("moved aside to " + dir + "/corrupt-step-000000300"), std::string::npos)
        << joined(w.seen);
  });
}

// Note [Never older than the newest]: a run whose step counter restarted (or one that
// saves "best" checkpoints into the same directory) saves a step below the newest
// one on disk. Every rank is refused, and every checkpoint stays, bytes and all.
TEST(Checkpointer, AnOlderStepIsRefusedOnEveryRankAndNothingIsLost) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  std::vector<std::string> errors(2);
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), 0.1);
    Checkpointer ckpt(dir, world.group(), CheckpointerOptions().keep_last(2));
    for (int step : {10, 20, 30}) ckpt.save(*model, opt, {step, 0, 0, {}}, torch::kCPU);
    const auto before = read_whole_file(ckpt.path_of(30) + "/model.pt");
    try {
      ckpt.save(*model, opt, {5, 0, 0, {}}, torch::kCPU);
    } catch (const cohort::ConfigError& e) {
      errors[static_cast<std::size_t>(world.rank())] = e.what();
    }
    world.group().barrier();
    EXPECT_EQ(ckpt.steps_on_disk(), (std::vector<std::int64_t>{20, 30}));
    EXPECT_FALSE(fs::exists(ckpt.path_of(5)));
    EXPECT_EQ(read_whole_file(ckpt.path_of(30) + "/model.pt"), before);
    EXPECT_EQ(ckpt.load_latest(*model, opt, torch::kCPU)->progress.step, 30);
  });
  for (const auto* part : {"refusing to save the checkpoint of step 5", "step-000000030", "load_latest",
                           "another directory", "nothing was written or removed"}) {
    EXPECT_NE(errors[0].find(part), std::string::npos) << errors[0];
  }
  EXPECT_NE(errors[1].find("rank 0 refused to save"), std::string::npos) << errors[1];
}

TEST(Checkpointer, AnotherModelIsAConfigErrorThatNamesTheKey) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_model(8);
    torch::optim::SGD opt(model->parameters(), 0.1);
    Checkpointer ckpt(dir, world.group());
    ckpt.save(*model, opt, {1, 0, 0, {}}, torch::kCPU);
    auto other = make_model(16);
    torch::optim::SGD other_opt(other->parameters(), 0.1);
    const auto before = other->parameters()[0].clone();
    try {
      ckpt.load_latest(*other, other_opt, torch::kCPU);
      ADD_FAILURE() << "no error";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'0.weight'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(torch::equal(before, other->parameters()[0]));  // left unchanged
  });
}

TEST(Checkpointer, RankZeroWritesEveryRankLoads) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  torch::manual_seed(3);
  auto reference = make_model();
  run_thread_world(2, [&](cohort::comm::World& world) {
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), 0.1);
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < model->parameters().size(); ++i) {
        // Only rank 0's weights may reach the file.
        model->parameters()[i].copy_(world.rank() == 0 ? reference->parameters()[i]
                                                       : torch::zeros_like(reference->parameters()[i]));
      }
    }
    Checkpointer ckpt(dir, world.group());
    ckpt.save(*model, opt, {7, 0, 0, {}}, torch::kCPU);
    auto fresh = make_model();
    torch::optim::SGD fresh_opt(fresh->parameters(), 0.1);
    auto restored = ckpt.load_latest(*fresh, fresh_opt, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    EXPECT_EQ(restored->progress.step, 7);
    EXPECT_TRUE(same_parameters(*fresh, *reference)) << "rank " << world.rank();
  });
  // Both ranks' generator states are in the file.
  const auto state = decode_trainer_state(read_whole_file(dir + "/step-000000007/trainer.pt"), "trainer.pt");
  EXPECT_EQ(state.rng.size(), 2u);
  // Loaded by one rank, the generators cannot be matched to ranks and keep their state.
  Warnings w;
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto fresh = make_model();
    torch::optim::SGD fresh_opt(fresh->parameters(), 0.1);
    Checkpointer ckpt(dir, world.group(), w.options());
    auto restored = ckpt.load_latest(*fresh, fresh_opt, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    EXPECT_FALSE(restored->rng_restored);
    EXPECT_TRUE(same_parameters(*fresh, *reference));
  });
  EXPECT_NE(joined(w.seen).find("saved by 2 ranks and is loaded by 1"), std::string::npos) << joined(w.seen);
}

// A checkpoint saved on a GPU holds two generator states per rank (the CPU's, then
// the CUDA device's). Resumed on a machine without a GPU, its weights, optimizer and
// progress load, the generators keep their fresh state, and a warning says why.
// The GPU's checkpoint is made here by giving a CPU checkpoint's ranks a second,
// CUDA-sized (seed and offset) state, under a manifest that matches the new bytes.
TEST(Checkpointer, SavedOnAGpuResumesOnTheCpuWithFreshGenerators) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  auto reference = make_model();
  run_thread_world(1, [&](cohort::comm::World& world) {
    torch::optim::SGD opt(reference->parameters(), 0.1);
    train_steps(reference, opt, 2);
    Checkpointer(dir, world.group()).save(*reference, opt, {5, 1, 2, some_sampler_state()}, torch::kCPU);
  });
  const std::string step = dir + "/step-000000005";
  const std::vector<std::string> names = {"model.pt", "optimizer.pt", "trainer.pt"};
  std::vector<std::string> contents;
  for (const auto& n : names) contents.push_back(read_whole_file(step + "/" + n));
  auto state = decode_trainer_state(contents[2], "trainer.pt");
  ASSERT_EQ(state.rng.size(), 1u);
  ASSERT_EQ(state.rng[0].size(), 1u) << "a CPU checkpoint holds the CPU generator only";
  state.rng[0].push_back(torch::arange(16, torch::kUInt8));
  contents[2] = encode_trainer_state(state.progress, state.rng);
  write_file_atomically(step + "/trainer.pt", contents[2]);
  write_file_atomically(step + "/MANIFEST.json", manifest_json(5, names, contents));

  Warnings w;
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto fresh = make_model();
    torch::optim::SGD fresh_opt(fresh->parameters(), 0.1);
    torch::manual_seed(123);
    const auto fresh_draws = torch::rand({4});
    torch::manual_seed(123);
    auto restored = Checkpointer(dir, world.group(), w.options()).load_latest(*fresh, fresh_opt, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    EXPECT_EQ(restored->progress.step, 5);
    EXPECT_EQ(restored->progress.epoch_step, 2);
    EXPECT_FALSE(restored->rng_restored);
    EXPECT_TRUE(same_parameters(*fresh, *reference));
    // The saved CPU state was not applied either: the generator goes on from its fresh state.
    EXPECT_TRUE(torch::equal(torch::rand({4}), fresh_draws));
  });
  EXPECT_NE(joined(w.seen).find("was saved on another kind of device (2 generator states per rank, 1 here): the "
                                "random generators keep their fresh state"),
            std::string::npos)
      << joined(w.seen);
}

TEST(Checkpointer, BadOptionsAndUnwritableDirectory) {
  run_thread_world(1, [&](cohort::comm::World& world) {
    EXPECT_THROW(Checkpointer("/tmp/x", world.group(), CheckpointerOptions().keep_last(0)), cohort::ConfigError);
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), 0.1);
    Checkpointer ckpt("/proc/cohort-cannot-write-here", world.group());
    try {
      ckpt.save(*model, opt, {1, 0, 0, {}}, torch::kCPU);
      ADD_FAILURE() << "no error";
    } catch (const cohort::Error& e) {
      EXPECT_NE(std::string(e.what()).find("could not write the checkpoint /proc/cohort-cannot-write-here"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(StateDict, SavedFileLoadsBackAndChecksNames) {
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  torch::manual_seed(5);
  auto model = make_model();
  save_state_dict(*model, dir + "/w.pt");
  auto other = make_model();
  load_state_dict_file(*other, dir + "/w.pt");
  EXPECT_TRUE(same_parameters(*model, *other));
  fs::resize_file(dir + "/w.pt", 100);
  EXPECT_THROW(load_state_dict_file(*other, dir + "/w.pt"), cohort::DataError);
}

bool has_temporary_entry(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) return true;
  }
  return false;
}

// kill -9 at random moments of a writer that saves in a loop: whatever is on disk
// afterwards either loads exactly what was saved at its step, or is skipped.
// `writer_flags`: "--async" makes the writer save asynchronously (the kills land in
// its writer thread, while the weights already hold the next step).
void kill_during_saves(const std::vector<std::string>& writer_flags) {
  using namespace std::chrono_literals;
  TempDir temp("cohort-ckpt");
  const auto& dir = temp.path;
  std::mt19937 random(12345);
  std::int64_t last_durable = 0;
  int caught_mid_save = 0;  // rounds whose kill left a half-written checkpoint
  constexpr int kRounds = 12;
  for (int round = 0; round < kRounds; ++round) {
    {
      std::vector<std::string> command = {COHORT_CHECKPOINT_WRITER_PATH, dir};
      command.insert(command.end(), writer_flags.begin(), writer_flags.end());
      cohort::testing::Subprocess writer(command);
      // Wait for this round's first save. Then, in odd rounds, kill as soon as a
      // temporary directory shows that a save is under way; in even rounds, at a random
      // moment.
      ASSERT_TRUE(writer.read_until([](const std::string& out) { return out.find("saved ") != std::string::npos; }, 60s))
          << writer.out();
      if (round % 2 == 1) {
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (!has_temporary_entry(dir) && std::chrono::steady_clock::now() < deadline) {
          writer.read_until([](const std::string&) { return false; }, 0ms);
        }
      } else {
        writer.read_until([](const std::string&) { return false; },
                          std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 60)(random)));
      }
      ::kill(writer.pid(), SIGKILL);
      auto result = writer.finish(30s);
      ASSERT_EQ(result.signal, SIGKILL) << result.out << result.err;
      // The last "saved N" line was printed after N was durable.
      const auto at = result.out.rfind("saved ");
      last_durable = std::stoll(result.out.substr(at + 6));
    }
    if (has_temporary_entry(dir)) ++caught_mid_save;
    run_thread_world(1, [&](cohort::comm::World& world) {
      auto model = torch::nn::Sequential(torch::nn::Linear(512, 512), torch::nn::Linear(512, 512),
                                         torch::nn::Linear(512, 512), torch::nn::Linear(512, 512));
      torch::optim::Adam optimizer(model->parameters(), 1e-3);
      Checkpointer ckpt(dir, world.group());
      auto restored = ckpt.load_latest(*model, optimizer, torch::kCPU);
      ASSERT_TRUE(restored.has_value()) << "round " << round;
      EXPECT_GE(restored->progress.step, last_durable) << "round " << round;
      for (auto& p : model->parameters()) {
        EXPECT_TRUE(p.eq(static_cast<double>(restored->progress.step)).all().item<bool>()) << "round " << round;
      }
    });
  }
  // The test is only worth something if kills landed inside saves.
  EXPECT_GE(caught_mid_save, 3);
  std::cout << caught_mid_save << " of " << kRounds << " kills landed inside a save\n";
}

TEST(Checkpointer, KillDuringSaveNeverLeavesABadCheckpoint) { kill_during_saves({}); }

TEST(Checkpointer, KillDuringAnAsynchronousWriteNeverLeavesABadCheckpoint) { kill_during_saves({"--async"}); }

// Found by fuzz_checkpoint_pickle: LibTorch's unpickler throws std::runtime_error, not
// c10::Error, for some bad files (here a dict with a None key), and that escaped the
// loaders as an exception no caller expects. It is a DataError naming the file now.
TEST(CheckpointFiles, BytesTheUnpicklerRejectsWithAnyExceptionAreDataErrors) {
  const std::string input = read_whole_file(std::string(COHORT_FUZZ_REGRESSIONS_DIR) +
                                            "/fuzz_checkpoint_pickle/none-dict-key");
  const std::string file = input.substr(1);  // the target's selector byte
  torch::nn::Linear model(2, 3);
  try {
    load_state_dict(*model, file, "model.pt");
    FAIL() << "loaded";
  } catch (const cohort::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("model.pt: cannot be read"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode_trainer_state(file, "trainer.pt"), cohort::DataError);
}

// Found by fuzz_checkpoint_pickle: a zip directory that points past the end of the file
// made LibTorch's own reader read out of bounds (Note [Bounded reads of torch.save
// files]); a SEGV under ASan, garbage or a crash without. A DataError now.
TEST(CheckpointFiles, AZipDirectoryPastTheEndIsADataError) {
  const std::string input = read_whole_file(std::string(COHORT_FUZZ_REGRESSIONS_DIR) +
                                            "/fuzz_checkpoint_pickle/zip-directory-past-the-end");
  EXPECT_THROW(decode_trainer_state(input.substr(1), "trainer.pt"), cohort::DataError);
  torch::nn::Linear model(2, 3);
  EXPECT_THROW(load_state_dict(*model, input.substr(1), "model.pt"), cohort::DataError);
}

// Found by fuzz_checkpoint_pickle: a pickle that begins with NEWOBJ made LibTorch
// 1.13's unpickler take values from an empty stack, a SEGV (Note [Pickles that
// underflow the stack]). A DataError saying where now, before LibTorch reads it.
TEST(CheckpointFiles, APickleThatTakesFromAnEmptyStackIsADataError) {
  const std::string input = read_whole_file(std::string(COHORT_FUZZ_REGRESSIONS_DIR) +
                                            "/fuzz_checkpoint_pickle/newobj-on-an-empty-stack");
  torch::nn::Linear model(2, 3);
  try {
    load_state_dict(*model, input.substr(1), "model.pt");
    FAIL() << "loaded";
  } catch (const cohort::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("model.pt: its pickle is malformed at byte 2 (opcode 0x81)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(decode_trainer_state(input.substr(1), "trainer.pt"), cohort::DataError);
}

// A state dict with a key that is not a string reached toStringRef(), LibTorch's
// internal assert; it is a DataError now.
TEST(CheckpointFiles, StateDictKeyThatIsNotAStringIsADataError) {
  torch::nn::Linear model(2, 3);
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  dict.insert(std::string("weight"), model->weight.detach().clone());
  dict.insert(std::string("bias"), model->bias.detach().clone());
  dict.insert(std::int64_t{5}, std::int64_t{0});
  EXPECT_THROW(load_state_dict(*model, torch_save_bytes(dict), "model.pt"), cohort::DataError);
}
