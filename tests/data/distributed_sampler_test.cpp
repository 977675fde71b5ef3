// DistributedSampler against independent computations: PyTorch's algorithm written
// out here, PyTorch itself (Debian's python3-torch), and uninterrupted runs.
#include "cohort/data/distributed_sampler.h"
#include "cohort/errors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace cohort::data {
namespace {

using Indices = std::vector<std::size_t>;

DistributedSampler make(std::size_t n, int rank, int world, std::uint64_t seed = 0, bool drop_last = false,
                        bool shuffle = true) {
  return DistributedSampler(n, DistributedSamplerOptions(rank, world).seed(seed).drop_last(drop_last).shuffle(shuffle));
}

Indices drain(DistributedSampler& s, std::size_t batch = 3) {
  Indices out;
  while (auto b = s.next(batch)) out.insert(out.end(), b->begin(), b->end());
  return out;
}

std::vector<Indices> all_shards(std::size_t n, int world, std::uint64_t seed, std::int64_t epoch, bool drop_last) {
  std::vector<Indices> shards;
  for (int r = 0; r < world; ++r) {
    auto s = make(n, r, world, seed, drop_last);
    s.set_epoch(epoch);
    shards.push_back(drain(s));
  }
  return shards;
}

// Undoes the round-robin deal: entry i of the global order went to rank i % W.
Indices interleave(const std::vector<Indices>& shards) {
  Indices order;
  const std::size_t w = shards.size();
  for (std::size_t i = 0; i < shards[0].size() * w; ++i) order.push_back(shards[i % w].at(i / w));
  return order;
}

// torch/utils/data/distributed.py, line by line, with the generator seeded the way
// torch.Generator().manual_seed() does it.
Indices pytorch_indices(std::int64_t n, std::int64_t w, std::int64_t rank, std::uint64_t seed, std::int64_t epoch,
                        bool drop_last, bool shuffle = true) {
  std::vector<std::int64_t> indices(n);
  std::iota(indices.begin(), indices.end(), 0);
  if (shuffle) {
    at::Generator g = at::detail::createCPUGenerator();
    g.set_current_seed(seed + static_cast<std::uint64_t>(epoch));
    auto perm = torch::randperm(n, g);
    std::copy(perm.data_ptr<std::int64_t>(), perm.data_ptr<std::int64_t>() + n, indices.begin());
  }
  const auto num_samples = (drop_last && n % w != 0) ? static_cast<std::int64_t>(std::ceil(double(n - w) / w))
                                                     : static_cast<std::int64_t>(std::ceil(double(n) / w));
  const auto total = num_samples * w;
  if (!drop_last) {
    const auto pad = total - n;
    std::vector<std::int64_t> extra;
    const std::int64_t repeats = pad <= n ? 1 : (pad + n - 1) / n;  // math.ceil(padding_size / len(indices))
    for (std::int64_t i = 0; i < repeats; ++i) extra.insert(extra.end(), indices.begin(), indices.end());
    indices.insert(indices.end(), extra.begin(), extra.begin() + pad);
  } else {
    indices.resize(total);
  }
  Indices out;
  for (auto i = rank; i < total; i += w) out.push_back(static_cast<std::size_t>(indices[i]));
  return out;
}

std::map<std::size_t, int> counts(const Indices& v) {
  std::map<std::size_t, int> c;
  for (auto i : v) ++c[i];
  return c;
}

TEST(DistributedSampler, ShardsCoverDatasetWithOnlyThePadding) {
  for (auto [n, w] : std::vector<std::pair<std::size_t, int>>{{10, 3}, {12, 4}, {1, 3}, {0, 3}, {2, 5}, {7, 1}}) {
    SCOPED_TRACE("N=" + std::to_string(n) + " W=" + std::to_string(w));
    const auto shards = all_shards(n, w, 3, 0, false);
    const std::size_t per_rank = (n + w - 1) / w;
    for (const auto& s : shards) EXPECT_EQ(s.size(), per_rank);
    const auto order = interleave(shards);
    // The first N entries are a permutation (disjoint, covering); the rest is the
    // documented padding: the order's beginning, repeated.
    Indices head(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
    std::sort(head.begin(), head.end());
    Indices all(n);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(head, all);
    for (std::size_t i = n; i < order.size(); ++i) EXPECT_EQ(order[i], order[i % n]);
  }
}

TEST(DistributedSampler, DropLastGivesDistinctSamplesOnly) {
  for (auto [n, w] : std::vector<std::pair<std::size_t, int>>{{10, 3}, {12, 4}, {1, 3}, {0, 3}, {13, 5}}) {
    SCOPED_TRACE("N=" + std::to_string(n) + " W=" + std::to_string(w));
    const auto shards = all_shards(n, w, 3, 1, true);
    Indices all;
    for (const auto& s : shards) {
      EXPECT_EQ(s.size(), n / w);
      all.insert(all.end(), s.begin(), s.end());
    }
    EXPECT_EQ(all.size(), n / w * w);
    EXPECT_EQ(counts(all).size(), all.size()) << "a sample appears twice";
    for (auto i : all) EXPECT_LT(i, n);
  }
}

TEST(DistributedSampler, OneOrderOnAllRanksNewEachEpochFixedBySeed) {
  auto global = [](std::uint64_t seed, std::int64_t epoch) { return all_shards(30, 1, seed, epoch, false)[0]; };
  // Ranks dealt from one order: reassembling them gives the one-rank order.
  const auto order = global(9, 2);
  EXPECT_EQ(interleave(all_shards(30, 4, 9, 2, true)), Indices(order.begin(), order.begin() + 28));
  EXPECT_EQ(interleave(all_shards(30, 5, 9, 2, false)), order);
  EXPECT_EQ(global(9, 2), global(9, 2));
  EXPECT_NE(global(9, 2), global(9, 3));
  EXPECT_NE(global(9, 2), global(8, 2));
  auto plain = make(6, 0, 1, 0, false, /*shuffle=*/false);
  plain.set_epoch(4);
  EXPECT_EQ(drain(plain), (Indices{0, 1, 2, 3, 4, 5}));
}

TEST(DistributedSampler, EqualsPyTorchAlgorithm) {
  for (std::int64_t n : {0, 1, 2, 7, 10, 12, 100}) {
    for (int w : {1, 3, 4, 8}) {
      for (bool drop_last : {false, true}) {
        for (bool shuffle : {false, true}) {
          for (int r = 0; r < w; ++r) {
            auto s = make(n, r, w, 17, drop_last, shuffle);
            s.set_epoch(3);
            EXPECT_EQ(drain(s), pytorch_indices(n, w, r, 17, 3, drop_last, shuffle))
                << "N=" << n << " W=" << w << " rank=" << r << " drop_last=" << drop_last << " shuffle=" << shuffle;
          }
        }
      }
    }
  }
}

// PyTorch itself. CI installs python3-torch, so a missing torch is a failure.
TEST(DistributedSampler, EqualsPythonDistributedSampler) {
  struct Case { int n, w, rank, seed, epoch; bool drop_last, shuffle; };
  const std::vector<Case> cases = {
      {10, 3, 0, 0, 0, false, true}, {10, 3, 1, 0, 0, false, true}, {10, 3, 2, 0, 0, false, true},
      {10, 3, 1, 42, 5, true, true}, {12, 4, 3, 7, 2, false, true}, {1, 3, 2, 0, 0, false, true},
      {2, 5, 4, 1, 1, false, true},  {5, 2, 1, 0, 0, false, false}, {1000, 7, 4, 123, 9, false, true},
      {1000, 7, 6, 123, 9, true, true}};
  std::ostringstream script;
  script << "/usr/bin/python3 - 2>&1 <<'EOF'\nfrom torch.utils.data import DistributedSampler\n";
  for (const auto& c : cases) {
    script << "s = DistributedSampler(range(" << c.n << "), num_replicas=" << c.w << ", rank=" << c.rank
           << ", shuffle=" << (c.shuffle ? "True" : "False") << ", seed=" << c.seed
           << ", drop_last=" << (c.drop_last ? "True" : "False") << ")\ns.set_epoch(" << c.epoch
           << ")\nprint('L', *list(s))\n";
  }
  script << "EOF\n";
  FILE* pipe = popen(script.str().c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (std::size_t got = std::fread(buf, 1, sizeof buf, pipe)) output.append(buf, got);
  ASSERT_EQ(pclose(pipe), 0) << "/usr/bin/python3 with torch is needed (apt install python3-torch):\n" << output;
  std::istringstream lines(output);
  for (const auto& c : cases) {
    std::string line, tag;
    ASSERT_TRUE(std::getline(lines, line)) << output;
    std::istringstream in(line);
    in >> tag;
    ASSERT_EQ(tag, "L") << output;
    Indices expected;
    for (std::size_t i; in >> i;) expected.push_back(i);
    auto s = make(c.n, c.rank, c.w, c.seed, c.drop_last, c.shuffle);
    s.set_epoch(c.epoch);
    EXPECT_EQ(drain(s), expected) << "N=" << c.n << " W=" << c.w << " rank=" << c.rank << " epoch=" << c.epoch;
  }
}

SamplerState round_trip(const DistributedSampler& s) {
  torch::serialize::OutputArchive out;
  s.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  auto loaded = make(23, 0, 1, /*seed=*/999);  // the seed must come from the archive
  loaded.load(in);
  return loaded.state();
}

TEST(DistributedSampler, ResumeMidEpochIsExact) {
  const std::size_t n = 23, batch = 2;
  const int w = 3;
  for (std::size_t k : {0, 1, 3, 4}) {
    for (int r = 0; r < w; ++r) {
      SCOPED_TRACE("k=" + std::to_string(k) + " rank=" + std::to_string(r));
      auto whole = make(n, r, w, 5);
      whole.set_epoch(2);
      const auto full = drain(whole, batch);
      const Indices rest(full.begin() + static_cast<std::ptrdiff_t>(std::min(k * batch, full.size())), full.end());

      auto before = make(n, r, w, 5);
      before.set_epoch(2);
      for (std::size_t i = 0; i < k; ++i) ASSERT_TRUE(before.next(batch).has_value());
      const auto state = before.state();
      EXPECT_EQ(state.consumed, static_cast<std::int64_t>(std::min(k * batch * w, n)));

      auto direct = make(n, r, w, /*seed=*/1);
      direct.load_state(state);
      EXPECT_EQ(direct.size(), rest.size());
      EXPECT_EQ(drain(direct, batch), rest);

      // The DataLoader path: set_epoch of the same epoch, then begin() -> reset().
      auto via_archive = make(n, r, w, /*seed=*/1);
      via_archive.load_state(round_trip(before));
      via_archive.set_epoch(2);
      via_archive.reset();
      EXPECT_EQ(drain(via_archive, batch), rest);
      via_archive.reset();  // a later pass is the whole epoch again
      EXPECT_EQ(drain(via_archive, batch), full);
    }
  }
  auto other_epoch = make(n, 0, w, 5);
  other_epoch.load_state(make(n, 0, w, 5).state_after(2));
  other_epoch.set_epoch(1);  // not the pending epoch: starts it from the beginning
  EXPECT_EQ(other_epoch.size(), 8u);
}

// Consume k samples per rank at world size w_old, then continue at w_new; returns all
// indices handed out this epoch.
Indices reshard(std::size_t n, int w_old, int w_new, std::size_t k, bool drop_last) {
  Indices seen;
  SamplerState state;
  for (int r = 0; r < w_old; ++r) {
    auto s = make(n, r, w_old, 11, drop_last);
    s.set_epoch(4);
    auto got = s.next(k);
    seen.insert(seen.end(), got->begin(), got->end());
    state = s.state();
  }
  for (int r = 0; r < w_new; ++r) {
    auto s = make(n, r, w_new, 0, drop_last);
    s.load_state(state);
    auto got = drain(s);
    seen.insert(seen.end(), got.begin(), got.end());
  }
  return seen;
}

TEST(DistributedSampler, ReshardingLosesAndDoublesNothing) {
  auto exactly_once = [](const Indices& seen, std::size_t n) {
    auto c = counts(seen);
    EXPECT_EQ(seen.size(), n);
    EXPECT_EQ(c.size(), n);
    for (auto [i, times] : c) EXPECT_TRUE(i < n && times == 1) << i;
  };
  exactly_once(reshard(26, 2, 3, 4, false), 26);  // rest 18 = 6 * 3
  exactly_once(reshard(30, 4, 2, 2, false), 30);  // rest 22 = 11 * 2
  exactly_once(reshard(30, 4, 2, 2, true), 30);
  // Rest 17 at W=3 needs one padding sample: all 25 once, one of them twice.
  auto padded = reshard(25, 2, 3, 4, false);
  EXPECT_EQ(padded.size(), 26u);
  EXPECT_EQ(counts(padded).size(), 25u);
  // Rest 23 at W=2 with drop_last drops one: 30 distinct of 31.
  auto dropped = reshard(31, 4, 2, 2, true);
  EXPECT_EQ(dropped.size(), 30u);
  EXPECT_EQ(counts(dropped).size(), 30u);
}

TEST(DistributedSampler, StateAfterEqualsStateAfterTakingSamples) {
  auto s = make(17, 1, 4, 3);
  s.set_epoch(1);
  const auto size = s.size();
  for (std::size_t k = 0; k <= size; ++k) {
    const auto predicted = s.state_after(k);
    auto walker = s.clone();
    walker.reset();
    for (std::size_t i = 0; i < k; ++i) walker.next(1);
    const auto actual = walker.state();
    EXPECT_EQ(predicted.consumed, actual.consumed);
    EXPECT_EQ(predicted.epoch, actual.epoch);
    EXPECT_EQ(predicted.seed, actual.seed);
  }
  EXPECT_EQ(s.state_after(size).consumed, 17);  // clamped: the last round was padded
  EXPECT_THROW(s.state_after(size + 1), ConfigError);
}

TEST(DistributedSampler, CopiesShareCloneDoesNot) {
  auto kept = make(10, 0, 2);
  auto copy = kept;
  auto moved = std::move(copy);
  auto independent = kept.clone();
  kept.set_epoch(7);
  EXPECT_EQ(moved.epoch(), 7);
  EXPECT_EQ(independent.epoch(), 0);
}

// A dataset whose examples are their own indices, so a batch shows what was sampled.
struct IndexDataset : torch::data::datasets::BatchDataset<IndexDataset, Indices, Indices> {
  explicit IndexDataset(std::size_t n) : n_(n) {}
  Indices get_batch(Indices request) override { return request; }
  torch::optional<std::size_t> size() const override { return n_; }
  std::size_t n_;
};

TEST(DistributedSampler, DrivesLibTorchDataLoader) {
  const std::size_t n = 50;  // 17 samples for rank 1 of 3, the last one padding
  auto options = [](std::size_t workers) { return torch::data::DataLoaderOptions().batch_size(4).workers(workers); };
  auto take_all = [](auto& loader) {
    Indices got;
    for (auto& batch : *loader) got.insert(got.end(), batch.begin(), batch.end());
    return got;
  };
  for (std::size_t workers : {0, 2}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    auto sampler = make(n, 1, 3, 6);
    auto loader = torch::data::make_data_loader(IndexDataset(n), sampler, options(workers));
    for (std::int64_t epoch : {0, 1}) {
      sampler.set_epoch(epoch);
      // In order also with workers: DataLoaderOptions::enforce_ordering is on by default.
      EXPECT_EQ(take_all(loader), pytorch_indices(n, 3, 1, 6, epoch, false));
    }
  }
  // Two batches trained with a loader whose workers fetch ahead; then a new process
  // loads the checkpointed state into its kept handle and iterates its loader.
  const auto full = pytorch_indices(n, 3, 1, 6, 1, false);
  auto first = make(n, 1, 3, 6);
  auto first_loader = torch::data::make_data_loader(IndexDataset(n), first, options(2));
  first.set_epoch(1);
  auto it = first_loader->begin();
  Indices trained = *it;
  ++it;
  trained.insert(trained.end(), (*it).begin(), (*it).end());
  ASSERT_EQ(trained, Indices(full.begin(), full.begin() + 8));
  const auto state = first.state_after(trained.size());
  EXPECT_GT(first.state().consumed, state.consumed);  // state() counts the prefetched batches too

  auto second = make(n, 1, 3, 0);
  auto loader = torch::data::make_data_loader(IndexDataset(n), second, options(0));
  second.load_state(state);
  second.set_epoch(1);
  EXPECT_EQ(take_all(loader), Indices(full.begin() + 8, full.end()));
  second.set_epoch(2);  // and the next epoch is whole again
  EXPECT_EQ(take_all(loader), pytorch_indices(n, 3, 1, 6, 2, false));
}

TEST(DistributedSampler, RejectsBadOptionsAndForeignStates) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  EXPECT_NE(message([] { make(5, 0, 0); }).find("world_size"), std::string::npos);
  EXPECT_NE(message([] { make(5, -1, 2); }).find("rank"), std::string::npos);
  EXPECT_NE(message([] { make(5, 2, 2); }).find("rank"), std::string::npos);
  auto s = make(5, 0, 2);
  SamplerState state = s.state();
  state.dataset_size = 6;
  EXPECT_NE(message([&] { s.load_state(state); }).find("dataset_size is 6 but this sampler's is 5"), std::string::npos);
  state = s.state();
  state.shuffle = false;
  EXPECT_NE(message([&] { s.load_state(state); }).find("shuffle"), std::string::npos);
  state = s.state();
  state.consumed = 6;
  EXPECT_NE(message([&] { s.load_state(state); }).find("consumed"), std::string::npos);
  torch::serialize::InputArchive empty;
  EXPECT_NE(message([&] { s.load(empty); }).find("distributed_sampler/"), std::string::npos);
  EXPECT_THROW(s.next(0), ConfigError);
}

}  // namespace
}  // namespace cohort::data
