// The data x pipeline x tensor mesh on threads over one store: coordinates, the ranks
// of each dimension's group, and a collective in each group that only its members
// join.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "cohort/comm/device_mesh.h"
#include "cohort/errors.h"
#include "support/thread_world.h"

namespace {

using cohort::comm::DeviceMesh;
using cohort::comm::MeshDim;
using cohort::comm::MeshShape;
using cohort::comm::World;

TEST(DeviceMesh, EightRanksAsTwoByTwoByTwoWithTensorInnermost) {
  std::mutex mu;
  std::vector<std::array<std::vector<int>, 3>> members(8);
  std::vector<std::array<double, 3>> sums(8);
  cohort::testing::run_thread_world(8, [&](World& w) {
    DeviceMesh mesh(w, MeshShape().pipeline(2).tensor(2));
    EXPECT_EQ(mesh.describe(), "dp 2 x pp 2 x tp 2");
    const int r = w.rank();
    EXPECT_EQ(mesh.global_rank(mesh.coordinate(MeshDim::kData), mesh.coordinate(MeshDim::kPipeline),
                               mesh.coordinate(MeshDim::kTensor)),
              r);
    for (auto dim : {MeshDim::kData, MeshDim::kPipeline, MeshDim::kTensor}) {
      auto& g = mesh.group(dim);
      EXPECT_EQ(g.size(), 2);
      EXPECT_EQ(g.rank(), mesh.coordinate(dim));
      auto t = torch::full({1}, static_cast<double>(r));
      g.all_reduce(t);
      std::lock_guard<std::mutex> lock(mu);
      members[static_cast<std::size_t>(r)][static_cast<std::size_t>(dim)] = g.global_ranks();
      sums[static_cast<std::size_t>(r)][static_cast<std::size_t>(dim)] = t.item<double>();
    }
  });
  // Tensor groups are consecutive ranks; pipelines step by the TP size; data groups by
  // pipeline x tensor.
  EXPECT_EQ(members[5][2], (std::vector<int>{4, 5}));
  EXPECT_EQ(members[5][1], (std::vector<int>{5, 7}));
  EXPECT_EQ(members[5][0], (std::vector<int>{1, 5}));
  EXPECT_EQ(members[2][1], (std::vector<int>{0, 2}));
  EXPECT_EQ(members[2][0], (std::vector<int>{2, 6}));
  for (int r = 0; r < 8; ++r)
    for (int d = 0; d < 3; ++d) {
      const auto& m = members[static_cast<std::size_t>(r)][static_cast<std::size_t>(d)];
      EXPECT_EQ(sums[static_cast<std::size_t>(r)][static_cast<std::size_t>(d)], m[0] + m[1])
          << "rank " << r << " dimension " << d;
    }
}

TEST(DeviceMesh, ADimensionOfOneIsThisRankAloneAndTheRestIsData) {
  cohort::testing::run_thread_world(4, [&](World& w) {
    DeviceMesh mesh(w, MeshShape().tensor(2));
    EXPECT_EQ(mesh.describe(), "dp 2 x pp 1 x tp 2");
    EXPECT_EQ(mesh.group(MeshDim::kPipeline).size(), 1);
    EXPECT_EQ(mesh.group(MeshDim::kPipeline).global_ranks(), std::vector<int>{w.rank()});
    EXPECT_EQ(mesh.group(MeshDim::kTensor).global_ranks(),
              (std::vector<int>{w.rank() / 2 * 2, w.rank() / 2 * 2 + 1}));
  });
}

TEST(DeviceMesh, SizesThatDoNotMultiplyToTheWorldAreRefused) {
  cohort::testing::run_thread_world(2, [&](World& w) {
    // Both ranks refuse without a collective; the barrier keeps the first to refuse
    // from tearing its world down while the other is still connecting to it (on
    // PyPI's 2.11, Gloo's connectFullMesh then failed on the slower rank).
    w.group().barrier();
    try {
      DeviceMesh mesh(w, MeshShape().tensor(4));
      ADD_FAILURE() << "a TP size of 4 was accepted in a world of 2";
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("2 ranks cannot form a mesh of data (the rest) x pipeline 1 x tensor 4"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
