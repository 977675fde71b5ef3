// Reading PyTorch's distributed checkpoints (issue 49): checkpoints that PyTorch 2.11's
// dcp.save wrote (tests/checkpoint/data/dcp-pytorch-2.11, README there) at world 1,
// under DDP at world 2 and under FSDP2 at world 2 read to the same whole state;
// Checkpointer loads them and its own Format::kDcp checkpoints; bad metadata is
// refused naming what is wrong.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/dcp/pickle_value.h"
#include "cohort/checkpoint/dcp/reader.h"
#include "cohort/checkpoint/dcp/to_cohort.h"
#include "cohort/checkpoint/dcp/unpickler.h"
#include "cohort/checkpoint/dcp/writer.h"
#include "cohort/compat/optimizer.h"
#include "cohort/errors.h"
#include "cohort/zero/sharded_optimizer.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace fs = std::filesystem;
namespace dcp = cohort::checkpoint::dcp;
using cohort::checkpoint::Checkpointer;
using cohort::checkpoint::CheckpointerOptions;
using cohort::checkpoint::Format;
using cohort::testing::run_thread_world;
using cohort::testing::TempDir;
using dcp::PyValue;

namespace {

const std::string kFixtures = COHORT_DCP_FIXTURES_DIR;

std::map<std::string, c10::IValue> by_key(const std::vector<dcp::Entry>& entries) {
  std::map<std::string, c10::IValue> out;
  for (const auto& e : entries) out.emplace(e.key, e.value);
  return out;
}

// The MLP of dcp_reference.py: Linear(5, 8), ReLU, Linear(8, 3).
torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(5, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const cohort::DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

// A load that skipped the newest checkpoint for the one of `step`, its first warning
// saying `why`.
void expect_falls_back(const std::optional<cohort::checkpoint::Restored>& restored, std::int64_t step,
                       const std::vector<std::string>& warnings, const std::string& why) {
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->progress.step, step);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find(why), std::string::npos) << warnings[0];
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

// Python's protocol 4 as pickle.dump writes .metadata: FRAME, MEMOIZE and BINGET,
// STACK_GLOBAL, NEWOBJ with BUILD, REDUCE of torch.Size and of getattr.
TEST(DcpUnpickler, ReadsPythonsOwnMetadata) {
  const auto bytes = slurp(kFixtures + "/world1/.metadata");
  ASSERT_EQ(static_cast<unsigned char>(bytes[1]), 4) << "the fixture is a protocol-4 pickle";
  const auto pickle = dcp::unpickle(bytes, "world1/.metadata");
  const auto& root = pickle.root();
  EXPECT_EQ(root.text, "torch.distributed.checkpoint.metadata.Metadata");
  const auto* items = root.find("state_dict_metadata");
  ASSERT_NE(items, nullptr);
  EXPECT_EQ(items->entries.size(), 29u);
  const auto* weight = items->entries[0].second;
  EXPECT_EQ(items->entries[0].first->text, "model.0.weight");
  EXPECT_EQ(weight->find("size")->describe(), "torch.Size((8, 5))");
  EXPECT_EQ(weight->find("properties")->state->items[0]->text, "torch.float32");
}

// The integers Python writes in their shortest form, and what is refused.
TEST(DcpUnpickler, IntegersOfEveryWidthAndBrokenStreams) {
  auto one = [](const std::string& body) { return dcp::unpickle("\x80\x04" + body + ".", "t").root().integer; };
  EXPECT_EQ(one(std::string("\x8a\x05\x00\x00\x00\x80\x00", 7)), std::int64_t{1} << 31);  // LONG1 of 5 bytes
  EXPECT_EQ(one(std::string("\x8a\x01\xff", 3)), -1);
  EXPECT_EQ(one(std::string("\x8a\x00", 2)), 0);
  EXPECT_EQ(one(std::string("J\xfe\xff\xff\xff", 5)), -2);
  EXPECT_EQ(one(std::string("M\x00\x01", 3)), 256);
  EXPECT_NE(error_of([] { dcp::unpickle(std::string("\x80\x04\x8a\x09", 4) + std::string(9, '\1') + ".", "t"); })
                .find("beyond 64 bits"),
            std::string::npos);
  EXPECT_NE(error_of([] { dcp::unpickle("\x80\x04h\x03.", "t"); }).find("memo entry 3"), std::string::npos);
  EXPECT_NE(error_of([] { dcp::unpickle(std::string("\x80\x04X\xff\x00\x00\x00" "ab", 9), "t"); }).find("runs past its end"),
            std::string::npos);
  EXPECT_NE(error_of([] { dcp::unpickle("\x80\x04K\x01", "t"); }).find("ends 1 bytes early"), std::string::npos);
  EXPECT_NE(error_of([] { dcp::unpickle("\x80\x04Q.", "t"); }).find("opcode 0x51"), std::string::npos);
  EXPECT_NE(error_of([] { dcp::unpickle("\x80\x04u.", "t"); }).find("no MARK"), std::string::npos);
  // The memo may make a cycle: a list that holds itself is read, and described.
  const auto cycle = dcp::unpickle(std::string("\x80\x04]\x94h\x00" "a.", 8), "t");
  EXPECT_EQ(cycle.root().items.at(0), &cycle.root());
  EXPECT_EQ(cycle.root().describe(), "[[a list of 1 items]]");
}

// dcp.save at world 1, under DDP at world 2 (replicated values spread over two files)
// and under FSDP2 at world 2 (each tensor in row chunks, 4 + 4 and 2 + 1): one state.
TEST(DcpReader, EveryLayoutPyTorchWritesReadsToTheSameWholeState) {
  const auto world1 = by_key(dcp::read_checkpoint(kFixtures + "/world1"));
  ASSERT_EQ(world1.size(), 29u);
  EXPECT_EQ(world1.at("model.0.weight").toTensor().sizes(), (std::vector<std::int64_t>{8, 5}));
  EXPECT_EQ(world1.at("optim.state.2.bias.step").toTensor().item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(world1.at("optim.param_groups.0.lr").toDouble(), 0.01);
  EXPECT_EQ(world1.at("train.step").toInt(), 7);
  for (const char* other : {"/world2-ddp", "/world2-fsdp2"}) {
    const auto metadata = dcp::read_metadata(kFixtures + other);
    EXPECT_EQ(metadata.files, (std::vector<std::string>{"__0_0.distcp", "__1_0.distcp"})) << other;
    const auto state = by_key(dcp::read_checkpoint(kFixtures + other));
    ASSERT_EQ(state.size(), world1.size()) << other;
    for (const auto& [key, value] : world1) {
      const auto& got = state.at(key);
      if (value.isTensor())
        EXPECT_TRUE(got.isTensor() && torch::equal(got.toTensor(), value.toTensor())) << other << " " << key;
      else
        EXPECT_EQ(got, value) << other << " " << key;
    }
  }
  const auto fsdp = dcp::read_metadata(kFixtures + "/world2-fsdp2");
  for (const auto& item : fsdp.items)
    if (item.key == "model.2.weight") {
      ASSERT_EQ(item.chunks.size(), 2u);
      EXPECT_EQ(item.chunks[1].offsets, (std::vector<std::int64_t>{2, 0}));
      EXPECT_EQ(item.chunks[1].sizes, (std::vector<std::int64_t>{1, 8}));
    }
}

// What a cohort run takes from it: the model's state dict and Adam's state, as a
// LibTorch Adam loads it.
TEST(DcpReader, MapsOntoTheModelAndALibTorchAdam) {
  const auto state = dcp::to_cohort(dcp::read_checkpoint(kFixtures + "/world2-fsdp2"), "fsdp2");
  EXPECT_EQ(state.optimizer, "adam");
  EXPECT_EQ(state.parameters_with_state, 4);
  EXPECT_EQ(state.step, 7);
  EXPECT_TRUE(state.ignored.empty());
  auto model = make_mlp();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.5));
  torch::serialize::InputArchive archive;
  archive.load_from(state.optimizer_bytes.data(), state.optimizer_bytes.size());
  adam.load(archive);
  // The checkpoint's hyperparameters are in the archive: LibTorch 2's optimizer.load
  // takes them, as Python's load_state_dict does; 1.13's keeps the program's.
  const auto& options = static_cast<const torch::optim::AdamOptions&>(adam.param_groups()[0].options());
  EXPECT_DOUBLE_EQ(options.lr(), TORCH_VERSION_MAJOR >= 2 ? 0.01 : 0.5);
  const auto reference = by_key(dcp::read_checkpoint(kFixtures + "/world1"));
  const auto params = model->named_parameters();
  for (const auto& p : params) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(
        *adam.state().find(cohort::compat::optimizer_state_key(p.value()))->second);
    EXPECT_EQ(s.step(), 1) << p.key();
    EXPECT_TRUE(torch::equal(s.exp_avg(), reference.at("optim.state." + p.key() + ".exp_avg").toTensor())) << p.key();
    EXPECT_TRUE(torch::equal(state.model.at(p.key()).toTensor(), reference.at("model." + p.key()).toTensor()));
  }
}

// A step-N directory that dcp.save wrote, as torchtitan lays them out, resumes
// through Checkpointer::load_latest: weights, Adam's state, the step.
TEST(DcpCheckpointer, LoadsACheckpointThatPyTorchWrote) {
  TempDir temp("cohort-dcp-read");
  fs::copy(kFixtures + "/world2-fsdp2", temp.path + "/step-7", fs::copy_options::recursive);
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_mlp();
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.5));
    std::vector<std::string> warnings;
    Checkpointer ckpt(temp.path, world.group(),
                      CheckpointerOptions().warn([&](const std::string& w) { warnings.push_back(w); }));
    const auto restored = ckpt.load_latest(*model, adam, torch::kCPU);
    ASSERT_TRUE(restored.has_value()) << ::testing::PrintToString(warnings);
    EXPECT_EQ(restored->progress.step, 7);
    EXPECT_FALSE(restored->rng_restored);
    const auto reference = by_key(dcp::read_checkpoint(kFixtures + "/world1"));
    for (const auto& p : model->named_parameters())
      EXPECT_TRUE(torch::equal(p.value(), reference.at("model." + p.key()).toTensor())) << p.key();
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("holds no random generator states"), std::string::npos) << warnings[0];
  });
}

// A data file that lost its end: the checkpoint is skipped with a warning saying
// which file, and the older one loads.
TEST(DcpCheckpointer, ATruncatedPyTorchCheckpointFallsBackToTheOlderOne) {
  TempDir temp("cohort-dcp-read");
  fs::copy(kFixtures + "/world1", temp.path + "/step-3", fs::copy_options::recursive);
  fs::copy(kFixtures + "/world2-ddp", temp.path + "/step-7", fs::copy_options::recursive);
  fs::resize_file(temp.path + "/step-7/__1_0.distcp", 1000);
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_mlp();
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.5));
    std::vector<std::string> warnings;
    Checkpointer ckpt(temp.path, world.group(),
                      CheckpointerOptions().warn([&](const std::string& w) { warnings.push_back(w); }));
    expect_falls_back(ckpt.load_latest(*model, adam, torch::kCPU), 3, warnings, "__1_0.distcp: holds 1000 bytes");
  });
}

// At eight ranks under ZeRO-1: every rank skips the truncated newest checkpoint
// together and loads the older one, PyTorch's DDP layout, resharding Adam's state
// onto its shards; saved in PyTorch's format (gathered to rank 0) and loaded again at
// four ranks, weights and Adam state are still PyTorch's, bit for bit.
TEST(DcpCheckpointer, EightRanksUnderZeroFallBackTogetherAndReshardOntoFour) {
  TempDir temp("cohort-dcp-read");
  fs::copy(kFixtures + "/world2-ddp", temp.path + "/step-3", fs::copy_options::recursive);
  fs::copy(kFixtures + "/world2-fsdp2", temp.path + "/step-7", fs::copy_options::recursive);
  fs::resize_file(temp.path + "/step-7/__1_0.distcp", 1000);
  const std::string out = temp.path + "/out";
  const auto reference = by_key(dcp::read_checkpoint(kFixtures + "/world1"));
  auto sharded_adam = [](torch::nn::Sequential& model, cohort::comm::World& world) {
    return std::make_unique<cohort::zero::ShardedOptimizer>(
        model->parameters(), world.group(), [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.5));
        });
  };
  auto expect_reference_weights = [&](torch::nn::Sequential& model, int rank) {
    for (const auto& p : model->named_parameters())
      EXPECT_TRUE(torch::equal(p.value(), reference.at("model." + p.key()).toTensor())) << rank << " " << p.key();
  };
  std::mutex mu;
  std::vector<std::int64_t> steps;
  run_thread_world(8, [&](cohort::comm::World& world) {
    auto model = make_mlp();
    auto adam = sharded_adam(model, world);
    std::vector<std::string> warnings;
    Checkpointer ckpt(temp.path, world.group(),
                      CheckpointerOptions().warn([&](const std::string& w) { warnings.push_back(w); }));
    const auto restored = ckpt.load_latest(*model, *adam, torch::kCPU);
    {
      std::lock_guard<std::mutex> lock(mu);
      steps.push_back(restored ? restored->progress.step : -1);
    }
    expect_reference_weights(model, world.rank());
    if (world.rank() == 0) {
      ASSERT_FALSE(warnings.empty());
      EXPECT_NE(warnings[0].find("__1_0.distcp: holds 1000 bytes"), std::string::npos) << warnings[0];
    }
    Checkpointer(out, world.group(), CheckpointerOptions().format(Format::kDcp))
        .save(*model, *adam, {4, 0, 0, {}}, torch::kCPU);
  });
  EXPECT_EQ(steps, std::vector<std::int64_t>(8, 3));
  const auto saved = by_key(dcp::read_checkpoint(out + "/step-000000004"));
  std::size_t same = 0;
  for (const auto& [key, value] : reference) {
    if (!value.isTensor() || key.rfind("train.", 0) == 0) continue;
    ASSERT_TRUE(saved.count(key)) << key;
    EXPECT_TRUE(torch::equal(saved.at(key).toTensor(), value.toTensor())) << key;
    ++same;
  }
  EXPECT_EQ(same, 4u + 3u * 4u);  // four weights; exp_avg, exp_avg_sq and step of each
  run_thread_world(4, [&](cohort::comm::World& world) {
    auto model = make_mlp();
    auto adam = sharded_adam(model, world);
    const auto restored = Checkpointer(out, world.group()).load_latest(*model, *adam, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    EXPECT_EQ(restored->progress.step, 4);
    expect_reference_weights(model, world.rank());
  });
}

// Format::kDcp: the step-N directory is PyTorch's format, checked by cohort's
// manifest; load_latest gives back exactly what was saved, generators included.
TEST(DcpCheckpointer, SavesInPyTorchsFormatAndLoadsItBack) {
  TempDir temp("cohort-dcp-write");
  run_thread_world(1, [&](cohort::comm::World& world) {
    torch::manual_seed(3);
    auto model = make_mlp();
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.1));
    model->forward(torch::randn({4, 5})).sum().backward();
    adamw.step();
    Checkpointer ckpt(temp.path, world.group(), CheckpointerOptions().format(Format::kDcp));
    const auto path = ckpt.save(*model, adamw, {5, 2, 1, {}}, torch::kCPU);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{".metadata", "MANIFEST.json", "__0_0.distcp", "trainer.pt"}));
    const auto saved = by_key(dcp::read_checkpoint(path));
    EXPECT_TRUE(saved.at("optim.param_groups.0.decoupled_weight_decay").toBool());
    EXPECT_EQ(saved.at("optim.param_groups.0.params").toListRef().size(), 4u);
    const auto after_save = torch::rand({1});

    auto loaded = make_mlp();
    torch::optim::AdamW fresh(loaded->parameters(), torch::optim::AdamWOptions(1.0));
    const auto restored = Checkpointer(temp.path, world.group()).load_latest(*loaded, fresh, torch::kCPU);
    ASSERT_TRUE(restored.has_value());
    EXPECT_EQ(restored->progress.step, 5);
    EXPECT_EQ(restored->progress.epoch, 2);
    EXPECT_TRUE(restored->rng_restored);
    EXPECT_TRUE(torch::equal(torch::rand({1}), after_save));
    const auto a = model->parameters(), b = loaded->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
      const auto& sa = static_cast<const torch::optim::AdamWParamState&>(
          *adamw.state().find(cohort::compat::optimizer_state_key(a[i]))->second);
      const auto& sb = static_cast<const torch::optim::AdamWParamState&>(
          *fresh.state().find(cohort::compat::optimizer_state_key(b[i]))->second);
      EXPECT_EQ(sa.step(), sb.step());
      EXPECT_TRUE(torch::equal(sa.exp_avg_sq(), sb.exp_avg_sq())) << i;
    }
    EXPECT_DOUBLE_EQ(saved.at("optim.param_groups.0.weight_decay").toDouble(), 0.1);
  });
}

// A damaged byte in the data file fails the manifest's checksum: the older
// checkpoint loads, and the damaged one is set aside, as for cohort's own format.
TEST(DcpCheckpointer, ACorruptDataFileFailsItsChecksum) {
  TempDir temp("cohort-dcp-write");
  run_thread_world(1, [&](cohort::comm::World& world) {
    auto model = make_mlp();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    std::vector<std::string> warnings;
    Checkpointer ckpt(temp.path, world.group(),
                      CheckpointerOptions().format(Format::kDcp).warn([&](const std::string& w) { warnings.push_back(w); }));
    ckpt.save(*model, sgd, {1, 0, 1, {}}, torch::kCPU);
    const auto path = ckpt.save(*model, sgd, {2, 0, 2, {}}, torch::kCPU);
    {
      std::fstream f(path + "/__0_0.distcp", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('\x5a');
    }
    expect_falls_back(ckpt.load_latest(*model, sgd, torch::kCPU), 1, warnings, "__0_0.distcp");
  });
}

TEST(DcpCheckpointer, RefusesShardedOptimizerStateAndUnknownOptimizers) {
  run_thread_world(1, [&](cohort::comm::World& world) {
    EXPECT_THROW(Checkpointer("/tmp/unused", world.group(),
                              CheckpointerOptions().format(Format::kDcp).shard_optimizer_state(true)),
                 cohort::ConfigError);
    EXPECT_THROW(Checkpointer("/tmp/unused", world.group(), CheckpointerOptions().dcp_optimizer("lamb")),
                 cohort::ConfigError);
  });
}

namespace {

// The metadata of one tensor "t" of shape [4] with the given chunks, each at
// offset 0 of __0_0.distcp (only parsing is tested: nothing is read).
std::string metadata_of(const std::vector<std::pair<std::int64_t, std::int64_t>>& chunks,
                        const std::string& file = "__0_0.distcp") {
  const std::string m = "torch.distributed.checkpoint.metadata";
  auto size = [](std::vector<std::int64_t> d) {
    std::vector<PyValue> items;
    for (auto v : d) items.push_back(PyValue::integer(v));
    return PyValue::call("torch", "Size", {PyValue::tuple(std::move(items))});
  };
  std::vector<PyValue> chunk_list;
  std::vector<std::pair<PyValue, PyValue>> storage;
  for (const auto& [offset, length] : chunks) {
    chunk_list.push_back(PyValue::object(m, "ChunkStorageMetadata",
                                         {PyValue::dict({{PyValue::string("offsets"), size({offset})},
                                                         {PyValue::string("sizes"), size({length})}})}));
    storage.emplace_back(
        PyValue::object(m, "MetadataIndex",
                        {PyValue::dict({{PyValue::string("fqn"), PyValue::string("t")},
                                        {PyValue::string("offset"), size({offset})}})}),
        PyValue::object("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                        {PyValue::dict({{PyValue::string("relative_path"), PyValue::string(file)},
                                        {PyValue::string("offset"), PyValue::integer(0)},
                                        {PyValue::string("length"), PyValue::integer(1000)}})}));
  }
  auto properties = PyValue::object(m, "TensorProperties", {PyValue::tuple({PyValue::global("torch", "float32")})});
  auto tensor = PyValue::object(m, "TensorStorageMetadata",
                                {PyValue::dict({{PyValue::string("properties"), properties},
                                                {PyValue::string("size"), size({4})},
                                                {PyValue::string("chunks"), PyValue::list(chunk_list)}})});
  return PyValue::object(m, "Metadata",
                         {PyValue::dict({{PyValue::string("state_dict_metadata"),
                                          PyValue::dict({{PyValue::string("t"), tensor}})},
                                         {PyValue::string("storage_data"), PyValue::dict(storage)}})})
      .pickle();
}

}  // namespace

// Note [Chunks tile the tensor]: every element from exactly one saved chunk.
TEST(DcpReader, RefusesChunksThatDoNotTileTheTensor) {
  EXPECT_EQ(dcp::parse_metadata(metadata_of({{0, 2}, {2, 2}}), "ok").items.at(0).chunks.size(), 2u);
  EXPECT_NE(error_of([] { dcp::parse_metadata(metadata_of({{0, 3}, {2, 2}}), "m"); }).find("overlap"),
            std::string::npos);
  EXPECT_NE(error_of([] { dcp::parse_metadata(metadata_of({{0, 2}}), "m"); }).find("hold 2 of its 4 elements"),
            std::string::npos);
  EXPECT_NE(error_of([] { dcp::parse_metadata(metadata_of({{0, 2}, {3, 2}}), "m"); }).find("outside its shape"),
            std::string::npos);
  EXPECT_NE(error_of([] { dcp::parse_metadata(metadata_of({{0, 4}}, "../x"), "m"); }).find("not a file of"),
            std::string::npos);
  EXPECT_NE(error_of([] { dcp::parse_metadata(PyValue::integer(3).pickle(), "m"); }).find("not a Metadata"),
            std::string::npos);
}

// What cohort writes, cohort reads back: bfloat16, a 0-d tensor, plain values.
TEST(DcpReader, ReadsBackWhatTheWriterWrites) {
  TempDir temp("cohort-dcp-rt");
  const auto bf = torch::arange(6, torch::kFloat).reshape({2, 3}).to(torch::kBFloat16);
  std::vector<dcp::Entry> entries = {
      {"model.w", {"model", "w"}, bf},
      {"optim.state.w.step", {"optim", "state", "w", "step"}, torch::scalar_tensor(4.0)},
      {"optim.param_groups.0.betas", {"optim", "param_groups", std::int64_t{0}, "betas"},
       c10::ivalue::Tuple::create(std::vector<c10::IValue>{0.9, 0.99})},
      {"train.step", {"train", "step"}, std::int64_t{12}}};
  dcp::write_checkpoint(temp.path + "/out", entries);
  const auto back = dcp::read_checkpoint(temp.path + "/out");
  ASSERT_EQ(back.size(), 4u);
  const auto m = by_key(back);
  EXPECT_EQ(m.at("model.w").toTensor().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(m.at("model.w").toTensor(), bf));
  EXPECT_EQ(m.at("optim.state.w.step").toTensor().dim(), 0);
  EXPECT_EQ(m.at("train.step").toInt(), 12);
  for (const auto& e : back) {
    if (e.key == "optim.param_groups.0.betas") {
      EXPECT_EQ(e.path, entries[2].path);
    }
  }
}

namespace {

// A one-parameter state as get_state_dict names it, with group 0's `options`.
std::vector<dcp::Entry> optimizer_entries(const std::vector<std::pair<std::string, c10::IValue>>& options,
                                          const c10::IValue& params, const c10::IValue& momentum_buffer) {
  std::vector<dcp::Entry> e = {{"model.w", {"model", "w"}, torch::ones({2})}};
  for (const auto& [k, v] : options) e.push_back({"optim.param_groups.0." + k, {"optim", "param_groups", std::int64_t{0}, k}, v});
  e.push_back({"optim.param_groups.0.params", {"optim", "param_groups", std::int64_t{0}, "params"}, params});
  e.push_back({"optim.state.w.momentum_buffer", {"optim", "state", "w", "momentum_buffer"}, momentum_buffer});
  return e;
}

std::string config_error_of(const std::vector<dcp::Entry>& entries) {
  try {
    dcp::to_cohort(entries, "ckpt");
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

// SGD with and without momentum (PyTorch keeps None then), RMSprop (it has momentum
// too, but no dampening) refused, and parameter groups that list numbers refused.
TEST(DcpReader, TellsOptimizersApartAndRefusesTheOnesItCannotLoad) {
  const c10::List<std::string> names({"w"});
  const std::vector<std::pair<std::string, c10::IValue>> sgd = {
      {"lr", 0.1}, {"momentum", 0.0}, {"dampening", 0.0}, {"nesterov", false}, {"weight_decay", 0.0}};
  const auto plain = dcp::to_cohort(optimizer_entries(sgd, names, c10::IValue()), "ckpt");
  EXPECT_EQ(plain.optimizer, "sgd");
  EXPECT_EQ(plain.parameters_with_state, 0);
  const auto with_momentum = dcp::to_cohort(optimizer_entries(sgd, names, torch::full({2}, 0.5)), "ckpt");
  EXPECT_EQ(with_momentum.parameters_with_state, 1);
  const std::vector<std::pair<std::string, c10::IValue>> rmsprop = {
      {"lr", 0.01}, {"momentum", 0.0}, {"alpha", 0.99}, {"eps", 1e-8}, {"centered", false}};
  EXPECT_NE(config_error_of(optimizer_entries(rmsprop, names, c10::IValue())).find("neither Adam, AdamW nor SGD"),
            std::string::npos);
  EXPECT_NE(config_error_of(optimizer_entries(sgd, c10::List<std::int64_t>({0}), c10::IValue()))
                .find("lists parameter numbers"),
            std::string::npos);
}
