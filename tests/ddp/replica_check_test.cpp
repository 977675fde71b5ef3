// The DDP replica check over ranks as threads (Note [Replica check without hangs]).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <future>

#include "cohort/comm/world.h"
#include "cohort/ddp/replica_check.h"
#include "cohort/errors.h"

namespace {
using namespace std::chrono_literals;
using cohort::ddp::describe_parameters;
using cohort::ddp::verify_replicas;

struct Net : torch::nn::Module {
  Net(int hidden, bool extra) {
    fc1 = register_module("fc1", torch::nn::Linear(4, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 2));
    if (extra) head = register_module("head", torch::nn::Linear(2, 2));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};

// Runs the check on `n` thread ranks, rank r wrapping make(r); returns each rank's
// error message ("" when it passed).
std::vector<std::string> check(int n, const std::function<std::shared_ptr<Net>(int)>& make) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = cohort::comm::InitOptions().backend("gloo").timeout(20s).join_timeout(20s);
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [=]() -> std::string {
      auto world = cohort::comm::World::init_with_store(store, r, n, options);
      auto net = make(r);
      try {
        verify_replicas(world.group(), describe_parameters(*net));
      } catch (const cohort::ConfigError& e) {
        return e.what();
      }
      return "";
    }));
  std::vector<std::string> out;
  for (auto& f : ranks) out.push_back(f.get());
  return out;
}

TEST(ReplicaCheck, DescribesParametersInRegistrationOrder) {
  Net net(8, false);
  auto d = describe_parameters(net);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].to_string(), "fc1.weight [8, 4] float");
  EXPECT_EQ(d[3].to_string(), "fc2.bias [2] float");
}

TEST(ReplicaCheck, IdenticalModelsPass) {
  for (const auto& message : check(3, [](int) { return std::make_shared<Net>(8, false); }))
    EXPECT_EQ(message, "");
}

TEST(ReplicaCheck, AShapeDifferenceIsNamedOnEveryRank) {
  auto messages = check(3, [](int r) { return std::make_shared<Net>(r == 2 ? 9 : 8, false); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(messages[r].find("cohort DDP on rank " + std::to_string(r)), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("rank differ from rank 0: 2"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("parameter #0: rank 0 has 'fc1.weight [8, 4] float', rank 2 has 'fc1.weight [9, 4] "
                               "float'"),
              std::string::npos)
        << messages[r];
  }
}

TEST(ReplicaCheck, ADifferentParameterCountNeverHangs) {
  auto messages = check(2, [](int r) { return std::make_shared<Net>(8, r == 1); });
  for (const auto& m : messages)
    EXPECT_NE(m.find("parameter #4: rank 0 has nothing, rank 1 has 'head.weight [2, 2] float'"), std::string::npos)
        << m;
}

TEST(ReplicaCheck, ADtypeDifferenceIsNamed) {
  auto messages = check(2, [](int r) {
    auto net = std::make_shared<Net>(8, false);
    if (r == 1) net->to(torch::kFloat64);
    return net;
  });
  for (const auto& m : messages)
    EXPECT_NE(m.find("rank 1 has 'fc1.weight [8, 4] double'"), std::string::npos) << m;
}

}  // namespace
