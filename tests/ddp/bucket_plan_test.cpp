// The DDP bucket planner (Note [Bucket ready order]): pure logic, no tensors.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "cohort/ddp/bucket_plan.h"

namespace {
using namespace cohort::ddp;

ParamMeta param(const std::string& name, std::int64_t numel, const std::string& dtype = "float",
                const std::string& device = "cpu") {
  ParamMeta p;
  p.name = name;
  p.numel = numel;
  p.element_size = dtype == "double" ? 8 : (dtype == "half" ? 2 : 4);
  p.dtype = dtype;
  p.device = device;
  return p;
}

// Every parameter in exactly one bucket, at the recorded position and offset.
void expect_consistent(const BucketPlan& plan, const std::vector<ParamMeta>& params) {
  std::set<std::size_t> seen;
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    const auto& bucket = plan.buckets[b];
    std::int64_t offset = 0, bytes = 0;
    for (std::size_t k = 0; k < bucket.params.size(); ++k) {
      auto i = bucket.params[k];
      EXPECT_TRUE(seen.insert(i).second) << "parameter " << i << " in two buckets";
      EXPECT_EQ(plan.bucket_of[i], b);
      EXPECT_EQ(plan.position_of[i], k);
      EXPECT_EQ(bucket.offsets[k], offset);
      EXPECT_EQ(params[i].dtype, bucket.dtype);
      EXPECT_EQ(params[i].device, bucket.device);
      offset += params[i].numel;
      bytes += params[i].bytes();
    }
    EXPECT_EQ(bucket.numel, offset);
    EXPECT_EQ(bucket.bytes, bytes);
  }
  EXPECT_EQ(seen.size(), params.size());
}

TEST(BucketPlan, FillsInReverseRegistrationOrderWithASmallFirstBucket) {
  // Ten 1000-float (4000-byte) parameters; first cap 8000 bytes, then 12000.
  std::vector<ParamMeta> params;
  for (int i = 0; i < 10; ++i) params.push_back(param("p" + std::to_string(i), 1000));
  auto plan = plan_buckets(params, reverse_registration_order(10),
                           BucketOptions().first_bucket_cap_bytes(8000).bucket_cap_bytes(12000));
  expect_consistent(plan, params);
  ASSERT_EQ(plan.buckets.size(), 4u);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<std::size_t>{9, 8}));
  EXPECT_EQ(plan.buckets[1].params, (std::vector<std::size_t>{7, 6, 5}));
  EXPECT_EQ(plan.buckets[2].params, (std::vector<std::size_t>{4, 3, 2}));
  EXPECT_EQ(plan.buckets[3].params, (std::vector<std::size_t>{1, 0}));  // the remainder
}

TEST(BucketPlan, DefaultsAreTwentyFiveAndOneMegabytes) {
  BucketOptions o;
  EXPECT_EQ(o.bucket_cap_bytes(), 25 * 1024 * 1024);
  EXPECT_EQ(o.first_bucket_cap_bytes(), 1024 * 1024);
}

TEST(BucketPlan, ABucketClosesOnceItReachesItsCap) {
  std::vector<ParamMeta> params{param("small_a", 10), param("huge", 1000000), param("small_b", 10)};
  auto plan = plan_buckets(params, {0, 1, 2}, BucketOptions().first_bucket_cap_bytes(100).bucket_cap_bytes(100));
  expect_consistent(plan, params);
  ASSERT_EQ(plan.buckets.size(), 2u);
  // small_a (40 bytes) is still open when huge arrives, so huge closes that bucket;
  // with a cap smaller than any parameter, every parameter travels alone.
  EXPECT_EQ(plan.buckets[0].params, (std::vector<std::size_t>{0, 1}));
  auto tiny = plan_buckets(params, {0, 1, 2}, BucketOptions().first_bucket_cap_bytes(1).bucket_cap_bytes(1));
  expect_consistent(tiny, params);
  EXPECT_EQ(tiny.buckets.size(), 3u);
}

TEST(BucketPlan, NeverMixesDtypesOrDevices) {
  std::vector<ParamMeta> params{param("a", 10), param("b", 10, "double"), param("c", 10),
                                param("d", 10, "float", "cuda:0"), param("e", 10, "double")};
  auto plan = plan_buckets(params, reverse_registration_order(5));
  expect_consistent(plan, params);
  ASSERT_EQ(plan.buckets.size(), 3u);
  // Launch order follows the first expected gradient of each bucket: e, d, c.
  EXPECT_EQ(plan.buckets[0].params, (std::vector<std::size_t>{4, 1}));
  EXPECT_EQ(plan.buckets[1].params, (std::vector<std::size_t>{3}));
  EXPECT_EQ(plan.buckets[2].params, (std::vector<std::size_t>{2, 0}));
}

TEST(BucketPlan, RebuildFollowsObservedArrivalsThenTheMissing) {
  auto order = order_from_arrivals({2, 0}, 4);
  EXPECT_EQ(order, (std::vector<std::size_t>{2, 0, 3, 1}));
  std::vector<ParamMeta> params(4, param("p", 100));
  auto plan = plan_buckets(params, order, BucketOptions().first_bucket_cap_bytes(800).bucket_cap_bytes(800));
  expect_consistent(plan, params);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(plan.buckets[1].params, (std::vector<std::size_t>{3, 1}));
}

TEST(BucketPlan, IsDeterministic) {
  std::vector<ParamMeta> params;
  for (int i = 0; i < 50; ++i) params.push_back(param("p", 100 + 37 * i, i % 3 ? "float" : "half"));
  auto order = reverse_registration_order(params.size());
  auto a = plan_buckets(params, order, BucketOptions().first_bucket_cap_bytes(3000).bucket_cap_bytes(9000));
  auto b = plan_buckets(params, order, BucketOptions().first_bucket_cap_bytes(3000).bucket_cap_bytes(9000));
  ASSERT_EQ(a.buckets.size(), b.buckets.size());
  for (std::size_t i = 0; i < a.buckets.size(); ++i) EXPECT_EQ(a.buckets[i].params, b.buckets[i].params);
  expect_consistent(a, params);
}

TEST(BucketPlan, RejectsBadInput) {
  std::vector<ParamMeta> params(3, param("p", 1));
  EXPECT_THROW(plan_buckets(params, {0, 1}), std::invalid_argument);
  EXPECT_THROW(plan_buckets(params, {0, 1, 1}), std::invalid_argument);
  EXPECT_THROW(plan_buckets(params, {0, 1, 3}), std::invalid_argument);
  EXPECT_THROW(plan_buckets(params, {0, 1, 2}, BucketOptions().bucket_cap_bytes(0)), std::invalid_argument);
  EXPECT_THROW(order_from_arrivals({5}, 3), std::invalid_argument);
}

}  // namespace
