#include "cohort/ddp/comm_hook.h"

#include <ATen/ATen.h>

namespace cohort::ddp {

BucketWork::BucketWork(comm::Pending pending, std::function<void()> then) : then_(std::move(then)) {
  pending_.push_back(std::move(pending));
}

BucketWork::BucketWork(std::vector<comm::Pending> pending, std::function<void()> then)
    : pending_(std::move(pending)), then_(std::move(then)) {}

void BucketWork::wait() {
  for (auto& p : pending_) p.wait();
  pending_.clear();
  if (auto then = std::move(then_)) {
    then_ = nullptr;
    then();
  }
}

bool BucketWork::is_completed() const {
  for (const auto& p : pending_)
    if (!p.is_completed()) return false;
  return true;
}

namespace {

class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "all_reduce"; }
  BucketWork start(comm::Group& group, GradBucket& bucket) override {
    auto buffer = bucket.buffer();
    const double divisor = bucket.divisor();
    return BucketWork(group.all_reduce_async(buffer), [buffer, divisor]() mutable {
      if (divisor != 1) buffer.div_(divisor);
    });
  }
};

// Note [Compressed reduction]: dividing before the cast keeps the sum of world-size
// values within the compressed type's range whenever each value is; the running sum
// is kept in the compressed type by the backend, hence the documented error.
class CastHook : public CommHook {
 public:
  CastHook(at::ScalarType type, std::string name) : type_(type), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  BucketWork start(comm::Group& group, GradBucket& bucket) override {
    auto buffer = bucket.buffer();
    auto compressed = buffer.div(bucket.divisor()).to(type_);
    return BucketWork(group.all_reduce_async(compressed), [buffer, compressed]() mutable { buffer.copy_(compressed); });
  }

 private:
  at::ScalarType type_;
  std::string name_;
};

}  // namespace

std::shared_ptr<CommHook> all_reduce_hook() { return std::make_shared<AllReduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() { return std::make_shared<CastHook>(at::kHalf, "fp16_compress"); }
std::shared_ptr<CommHook> bf16_compress_hook() { return std::make_shared<CastHook>(at::kBFloat16, "bf16_compress"); }

}  // namespace cohort::ddp
