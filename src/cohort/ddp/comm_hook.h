#pragma once
// How a bucket of gradients is reduced across ranks. DDP calls the hook from the
// autograd thread as soon as every gradient of a bucket is ready; the hook starts
// the communication and returns at once; DDP waits for it at the end of backward.
//
//   // Built-in hooks:
//   options.comm_hook(cohort::ddp::all_reduce_hook());          // the default
//   options.comm_hook(cohort::ddp::fp16_compress_hook());       // half the bytes
//   options.comm_hook(cohort::ddp::bf16_compress_hook());
//
//   // A hook of your own:
//   struct SignHook : cohort::ddp::CommHook {
//     std::string name() const override { return "sign"; }
//     cohort::ddp::BucketWork start(cohort::comm::Group& group, cohort::ddp::GradBucket& b) override {
//       auto signs = b.buffer().sign().div_(b.divisor());
//       auto pending = group.all_reduce_async(signs);
//       return cohort::ddp::BucketWork(std::move(pending), [&b, signs] { b.buffer().copy_(signs); });
//     }
//   };
//
// Contract: start() must issue the same collectives, in the same order, on every rank
// (they are matched by order). bucket.buffer() arrives holding this rank's gradients
// already divided by bucket.divisor(), so that the sum over ranks is the average;
// the work, once waited for, must have written that sum into bucket.buffer().
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/group.h"

namespace cohort::ddp {

// One bucket of gradients, as a hook sees it.
class GradBucket {
 public:
  GradBucket(std::size_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> gradients,
             double divisor, std::vector<std::size_t> parameters = {})
      : index_(index), is_last_(is_last), buffer_(std::move(buffer)), gradients_(std::move(gradients)),
        divisor_(divisor), parameters_(std::move(parameters)) {}
  // Buckets are numbered in launch order; 0 is reduced first.
  std::size_t index() const { return index_; }
  bool is_last() const { return is_last_; }
  // This rank's gradients divided by divisor(), flattened into one tensor (one
  // dtype, one device). The hook replaces them with their sum over ranks.
  at::Tensor& buffer() { return buffer_; }
  // Views of buffer(), one per parameter, shaped like the parameter.
  const std::vector<at::Tensor>& gradients() const { return gradients_; }
  // The position of each gradient's parameter in the model's parameter list: stable
  // when DDP rebuilds its buckets, so per-parameter state (PowerSGD's) is keyed by
  // it. Empty for a bucket made by hand; then gradient i counts as parameter i.
  const std::vector<std::size_t>& parameters() const { return parameters_; }
  // What buffer() has been divided by: the world size, or under a join with
  // divide_by_initial_world_size(false) the number of ranks that have not joined.
  double divisor() const { return divisor_; }

 private:
  std::size_t index_;
  bool is_last_;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_;
  double divisor_;
  std::vector<std::size_t> parameters_;
};

// A hook's communication in flight: pending collectives, then a step that runs
// after all of them completed (e.g. decompress into the bucket).
class BucketWork {
 public:
  BucketWork() = default;
  explicit BucketWork(comm::Pending pending, std::function<void()> then = nullptr);
  BucketWork(std::vector<comm::Pending> pending, std::function<void()> then);
  // Waits (bounded by the group's timeout), then runs the final step. Once only.
  void wait();
  bool is_completed() const;

 private:
  std::vector<comm::Pending> pending_;
  std::function<void()> then_;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual BucketWork start(comm::Group& group, GradBucket& bucket) = 0;
};

// Sum, in the gradients' own dtype. Exact up to float rounding.
std::shared_ptr<CommHook> all_reduce_hook();
// Cast the (divided) bucket to float16 (bfloat16), sum, cast back: half the
// bytes of float32. Documented error, checked by tests/multiproc/ddp_test.cpp: with
// n ranks whose gradients are g_1..g_n, every element of the result is within
//   (n + 1) * eps * mean_q |g_q|
// of the exact average, eps = 2^-11 for float16 and 2^-8 for bfloat16 (each
// contribution is rounded once, and the running sum once per addition). float16
// overflows above 65504; the bucket arrives divided, so the sum stays in range
// whenever each value does. bfloat16 over Gloo: Note [bfloat16 over Gloo] in comm_hook.cpp.
std::shared_ptr<CommHook> fp16_compress_hook();
std::shared_ptr<CommHook> bf16_compress_hook();

}  // namespace cohort::ddp
