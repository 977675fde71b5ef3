#include "cohort/ddp/bucket_plan.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

namespace cohort::ddp {
namespace {

void check_permutation(const std::vector<std::size_t>& order, std::size_t n, const char* what) {
  std::vector<bool> seen(n, false);
  for (auto i : order) {
    if (i >= n)
      throw std::invalid_argument(std::string(what) + ": parameter index " + std::to_string(i) + " is out of range (" +
                                  std::to_string(n) + " parameters)");
    if (seen[i]) throw std::invalid_argument(std::string(what) + ": parameter index " + std::to_string(i) + " repeats");
    seen[i] = true;
  }
}

}  // namespace

std::vector<std::size_t> reverse_registration_order(std::size_t n) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

std::vector<std::size_t> order_from_arrivals(const std::vector<std::size_t>& arrived, std::size_t n) {
  check_permutation(arrived, n, "order_from_arrivals");
  std::vector<bool> present(n, false);
  for (auto i : arrived) present[i] = true;
  auto order = arrived;
  for (auto i : reverse_registration_order(n))
    if (!present[i]) order.push_back(i);
  return order;
}

BucketPlan plan_buckets(const std::vector<ParamMeta>& params, const std::vector<std::size_t>& order,
                        const BucketOptions& options) {
  if (options.bucket_cap_bytes() <= 0 || options.first_bucket_cap_bytes() <= 0)
    throw std::invalid_argument("plan_buckets: bucket caps must be positive");
  if (order.size() != params.size())
    throw std::invalid_argument("plan_buckets: the order names " + std::to_string(order.size()) +
                                " parameters, the model has " + std::to_string(params.size()));
  check_permutation(order, params.size(), "plan_buckets");

  // One open bucket per (dtype, device); each key's first bucket has the first cap.
  // A bucket closes once it reaches its cap, so a parameter larger than the cap
  // closes the bucket it lands in: alone if that bucket was empty.
  struct Open {
    Bucket bucket;
    std::size_t first_position;  // where in `order` its first parameter stood
  };
  std::map<std::pair<std::string, std::string>, Open> open;
  std::map<std::pair<std::string, std::string>, int> closed_count;
  std::vector<Open> done;
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const auto& p = params[order[pos]];
    auto key = std::make_pair(p.dtype, p.device);
    auto it = open.find(key);
    if (it == open.end()) {
      Open fresh{Bucket{}, pos};
      fresh.bucket.dtype = p.dtype;
      fresh.bucket.device = p.device;
      it = open.emplace(key, std::move(fresh)).first;
    }
    auto& b = it->second.bucket;
    b.params.push_back(order[pos]);
    b.offsets.push_back(b.numel);
    b.numel += p.numel;
    b.bytes += p.bytes();
    auto cap = closed_count[key] == 0 ? options.first_bucket_cap_bytes() : options.bucket_cap_bytes();
    if (b.bytes >= cap) {
      done.push_back(std::move(it->second));
      open.erase(it);
      ++closed_count[key];
    }
  }
  for (auto& [key, o] : open) done.push_back(std::move(o));
  // Launch order: by when each bucket's first gradient is expected.
  std::stable_sort(done.begin(), done.end(),
                   [](const Open& a, const Open& b) { return a.first_position < b.first_position; });

  BucketPlan plan;
  plan.bucket_of.assign(params.size(), 0);
  plan.position_of.assign(params.size(), 0);
  for (auto& o : done) {
    for (std::size_t k = 0; k < o.bucket.params.size(); ++k) {
      plan.bucket_of[o.bucket.params[k]] = plan.buckets.size();
      plan.position_of[o.bucket.params[k]] = k;
    }
    plan.buckets.push_back(std::move(o.bucket));
  }
  return plan;
}

}  // namespace cohort::ddp
