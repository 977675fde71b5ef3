// c10d's own Gloo backend, and a cohort World, rendezvous through the authenticated
// store: ranks as threads, each with its own client connection.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <future>

#include "cohort/comm/world.h"
#include "cohort/store/store_client.h"
#include "cohort/store/store_server.h"
#include "support/thread_world.h"

namespace {
using cohort::store::StoreClient;
using cohort::store::StoreServer;
using cohort::store::StoreServerOptions;
using namespace std::chrono_literals;

const std::string kToken = "gloo-over-cohort-store";

template <typename Body>
void run_ranks(const StoreServer& server, int n, Body body) {
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), kToken, 30s);
      body(store, r);
    }));
  for (auto& f : ranks) f.get();
}

TEST(StoreWithGloo, ProcessGroupGlooAllReduces) {
  StoreServer server{StoreServerOptions(kToken)};
  run_ranks(server, 2, [](c10::intrusive_ptr<StoreClient> store, int rank) {
    auto opts = c10d::ProcessGroupGloo::Options::create(30s);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gloo", store);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, 2, opts);
    std::vector<at::Tensor> tensors{torch::full({4}, static_cast<float>(rank + 1))};
    pg->allreduce(tensors)->wait();
    EXPECT_TRUE(torch::equal(tensors[0], torch::full({4}, 3.0f)));
  });
}

TEST(StoreWithGloo, CohortWorldJoinsAndReduces) {
  StoreServer server{StoreServerOptions(kToken)};
  run_ranks(server, 2, [](c10::intrusive_ptr<StoreClient> store, int rank) {
    auto world = cohort::comm::World::init_with_store(store, rank, 2, cohort::testing::quick_thread_world_options());
    auto t = torch::full({2}, static_cast<double>(rank + 1), torch::kFloat64);
    world.group().all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({2}, 3.0, torch::kFloat64)));
  });
}

}  // namespace
