#include "cohort/ddp/sync_batch_norm.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>
#include <vector>

#include "cohort/errors.h"

namespace cohort::ddp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Note [Backward of the statistics all-reduce]
// Every rank normalizes with the global sums S = s_0 + ... + s_{W-1}, so every rank's
// loss L_r depends on every rank's local sums s_q, and training minimizes
// L = L_0 + ... + L_{W-1} (DDP's averaging only scales that by 1/W). The chain rule
// gives dL/ds_q = sum_r dL_r/dS, yet rank q's autograd holds only dL_q/dS. So the
// backward of the forward's all-reduce-sum is an all-reduce-sum of the incoming
// gradient; everything else (mean, variance, normalization) is ordinary
// differentiable ops on S and the local input. Two consequences: backward is a
// collective, so every rank must run it through every SyncBatchNorm it ran forward
// through, in the same order (true when the ranks run the same graph); and a rank's
// input gradient is that of the *total* loss, the same convention as PyTorch's.
class AllReduceSum : public torch::autograd::Function<AllReduceSum> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, comm::Group group) {
    auto global = local.clone(at::MemoryFormat::Contiguous);
    group.all_reduce(global, comm::ReduceOp::kSum);
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
    return global;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto capsule = ctx->saved_data["group"].toCapsule();
    auto grad = grads[0].clone(at::MemoryFormat::Contiguous);
    static_cast<GroupCapsule*>(capsule.get())->group.all_reduce(grad, comm::ReduceOp::kSum);
    return {grad, at::Tensor()};  // none for the group
  }

 private:
  // Carries the group from forward to backward in saved_data, which holds IValues.
  struct GroupCapsule : torch::CustomClassHolder {
    explicit GroupCapsule(comm::Group g) : group(std::move(g)) {}
    comm::Group group;
  };
};

std::string shape_of(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

void check_batch(double values_per_channel, const at::Tensor& input, const comm::Group& group) {
  if (values_per_channel > 1) return;
  throw ConfigError(fmt::format(
      "cohort: SyncBatchNorm: expected more than 1 value per channel when training, got {} over the {} rank(s) "
      "of group '{}' (input {} on rank {}); use a larger batch or call eval()",
      values_per_channel, group.size(), group.name(), shape_of(input), group.rank()));
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions opts) : options(std::move(opts)) {
  if (options.num_features() < 1)
    throw ConfigError(fmt::format("cohort: SyncBatchNorm needs num_features >= 1, got {}", options.num_features()));
  reset();
}

void SyncBatchNormImpl::reset() {
  const auto c = options.num_features();
  // Undefined tensors are registered too, as torch::nn::BatchNorm does.
  weight = register_parameter("weight", options.affine() ? torch::empty({c}) : at::Tensor(), options.affine());
  bias = register_parameter("bias", options.affine() ? torch::empty({c}) : at::Tensor(), options.affine());
  const bool track = options.track_running_stats();
  running_mean = register_buffer("running_mean", track ? torch::zeros({c}) : at::Tensor());
  running_var = register_buffer("running_var", track ? torch::ones({c}) : at::Tensor());
  num_batches_tracked =
      register_buffer("num_batches_tracked", track ? torch::zeros({}, torch::kLong) : at::Tensor());
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  at::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "cohort::ddp::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2)
    throw ConfigError(fmt::format("cohort: SyncBatchNorm expects an input [N, C, *] with at least 2 dimensions, "
                                  "got {}", shape_of(input)));
  if (input.size(1) != options.num_features())
    throw ConfigError(fmt::format("cohort: SyncBatchNorm({}) expects {} channels in dimension 1 of its input, got {} "
                                  "(input {})", options.num_features(), options.num_features(), input.size(1),
                                  shape_of(input)));
  if (!input.is_floating_point())
    throw ConfigError("cohort: SyncBatchNorm expects a floating-point input, got " +
                      std::string(c10::toString(input.scalar_type())));
  const bool cudnn = at::globalContext().userEnabledCuDNN();
  if (!is_training())  // As PyTorch's: without running statistics, the local batch's.
    return at::batch_norm(input, weight, bias, running_mean, running_var,
                          /*training=*/!options.track_running_stats(), /*momentum=*/0.0, options.eps(), cudnn);
  auto group = checked_group();
  if (group.size() > 1) return forward_synced(input, group);
  check_batch(static_cast<double>(input.numel() / input.size(1)), input, group);
  return at::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/true,
                        advance_running_average(), options.eps(), cudnn);
}

comm::Group SyncBatchNormImpl::checked_group() const {
  if (!options.group().is_member())
    throw ConfigError(
        "cohort: SyncBatchNorm in training mode needs the group whose ranks share the batch statistics, and it has "
        "none (or this rank is not a member): pass it as SyncBatchNormOptions(C).group(world.group()), or to "
        "convert_sync_batchnorm(model, world.group())");
  return options.group();
}

double SyncBatchNormImpl::advance_running_average() {
  if (!options.track_running_stats()) return 0.0;
  num_batches_tracked += 1;
  if (options.momentum()) return *options.momentum();
  return 1.0 / num_batches_tracked.item<double>();  // a cumulative moving average
}

at::Tensor SyncBatchNormImpl::forward_synced(const at::Tensor& input, comm::Group& group) {
  const auto c = options.num_features();
  // Squares of half or bfloat16 values overflow and cancel: accumulate in float.
  const auto reduced = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  const auto x = input.to(reduced ? at::kFloat : input.scalar_type());
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);

  // One collective for [sum (C), sum of squares (C), count (1)] per rank. The variance
  // is E[x^2] - mean^2: two sums that one all-reduce adds up, where E[(x - mean)^2]
  // would need a second round trip. It loses about float epsilon * mean^2 / var of
  // relative precision to cancellation (so 1e-3 at |mean| = 100 std in float32), and
  // the clamp keeps rounding from making it negative.
  const double local_count = static_cast<double>(x.numel() / c);
  auto local = at::cat({x.sum(dims), x.square().sum(dims), at::full({1}, local_count, x.options())});
  auto global = AllReduceSum::apply(local, group);  // Note [Backward of the statistics all-reduce]
  const double count = global[2 * c].item<double>();
  check_batch(count, input, group);
  auto mean = global.narrow(0, 0, c) / count;
  auto var = (global.narrow(0, c, c) / count - mean.square()).clamp_min(0);

  if (options.track_running_stats()) {
    at::NoGradGuard no_grad;
    const double factor = advance_running_average();
    const auto unbiased = var.detach() * (count / (count - 1));
    running_mean.mul_(1 - factor).add_(mean.detach().to(running_mean.dtype()), factor);
    running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype()), factor);
  }

  std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[1] = c;
  auto scale = (var + options.eps()).rsqrt();
  if (weight.defined()) scale = scale * weight;
  auto out = (x - mean.view(shape)) * scale.view(shape);
  if (bias.defined()) out = out + bias.view(shape);
  return out.to(input.scalar_type());
}

}  // namespace cohort::ddp
