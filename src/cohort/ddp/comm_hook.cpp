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
    // A group of one has nothing to exchange: skipping the backend saves a hand-off
    // to its worker thread per bucket, which is most of DDP's cost at world 1.
    if (group.size() == 1) return BucketWork();
    return BucketWork(group.all_reduce_async(bucket.buffer()));
  }
};

// Note [Compressed reduction]: the bucket arrives divided (Note [Divide on the way
// in]), so the sum of world-size values stays within the compressed type's range
// whenever each value is; the running sum is kept in the compressed type by the
// backend, hence the documented error.
class CastHook : public CommHook {
 public:
  CastHook(at::ScalarType type, std::string name) : type_(type), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  BucketWork start(comm::Group& group, GradBucket& bucket) override {
    auto buffer = bucket.buffer();
    auto compressed = buffer.to(type_);
    return BucketWork(group.all_reduce_async(compressed), [buffer, compressed]() mutable { buffer.copy_(compressed); });
  }

 private:
  at::ScalarType type_;
  std::string name_;
};

// Note [bfloat16 over Gloo]
// Gloo in LibTorch 1.13 cannot sum bfloat16. Over Gloo the compressed values are
// therefore all-gathered instead (moving bytes needs no arithmetic, so they travel
// as float16-typed storage) and summed here in float32: each rank still sends half
// the bytes of a float32 bucket, and the sum adds no rounding of its own. NCCL sums
// bfloat16 natively.
class Bf16Hook : public CommHook {
 public:
  std::string name() const override { return "bf16_compress"; }
  BucketWork start(comm::Group& group, GradBucket& bucket) override {
    if (group.backend_name() != "gloo") return native_.start(group, bucket);
    auto buffer = bucket.buffer();
    auto compressed = buffer.to(at::kBFloat16);
    auto parts = std::make_shared<std::vector<at::Tensor>>();
    auto pending = group.all_gather_async(compressed.view(at::kHalf), *parts);
    return BucketWork(std::move(pending), [buffer, parts]() mutable {
      auto sum = at::zeros_like(buffer, buffer.options().dtype(at::kFloat));
      for (const auto& part : *parts) sum.add_(part.view(at::kBFloat16).to(at::kFloat));
      buffer.copy_(sum);
    });
  }

 private:
  CastHook native_{at::kBFloat16, "bf16_compress"};
};

}  // namespace

std::shared_ptr<CommHook> all_reduce_hook() { return std::make_shared<AllReduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() { return std::make_shared<CastHook>(at::kHalf, "fp16_compress"); }
std::shared_ptr<CommHook> bf16_compress_hook() { return std::make_shared<Bf16Hook>(); }

}  // namespace cohort::ddp
