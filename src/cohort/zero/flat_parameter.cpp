#include "cohort/zero/flat_parameter.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>

#include <algorithm>

#include "cohort/errors.h"

namespace cohort::zero {
namespace {

// Gathering copies bytes, so bfloat16 travels as float16, which Gloo in LibTorch
// 1.13 has (it has neither bfloat16 nor int16); no arithmetic touches it.
at::Tensor bits(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t; }

}  // namespace

FlatParameter::FlatParameter(std::vector<at::Tensor> params, std::vector<std::string> names, comm::Group group,
                             std::optional<at::ScalarType> param_dtype)
    : params_(std::move(params)), names_(std::move(names)), group_(std::move(group)) {
  TORCH_INTERNAL_ASSERT(!params_.empty() && params_.size() == names_.size());
  world_ = group_.size();
  rank_ = group_.rank();
  const auto& first = params_.front();
  const auto dtype = first.scalar_type();
  compute_dtype_ = param_dtype && at::isFloatingType(dtype) ? *param_dtype : dtype;
  for (const auto& p : params_) {
    shapes_.push_back(p.sizes().vec());
    offsets_.push_back(total_);
    total_ += p.numel();
  }
  chunk_ = std::max<std::int64_t>(1, (total_ + world_ - 1) / world_);
  at::NoGradGuard no_grad;
  auto flat = at::zeros({chunk_ * world_}, first.options().dtype(dtype));
  for (std::size_t i = 0; i < params_.size(); ++i)
    flat.narrow(0, offsets_[i], params_[i].numel()).copy_(params_[i].reshape({-1}));
  // Rank 0's values, as DDP starts from; one flat at a time, so that setting up
  // holds the model and one flat, not the model twice.
  group_.broadcast(flat, 0);
  shard_ = flat.narrow(0, rank_ * chunk_, chunk_).clone();
  shard_.set_requires_grad(first.requires_grad());
  full_ = at::empty({chunk_ * world_}, first.options().dtype(compute_dtype_));
  // Autograd records a leaf's shape when it makes its gradient accumulator: make
  // them now, while the parameters have their own sizes (Note [Freeing in place]).
  if (trainable())
    for (const auto& p : params_) {
      accumulators_.push_back(torch::autograd::impl::grad_accumulator(p));
      TORCH_INTERNAL_ASSERT(accumulators_.back(), "a leaf parameter that requires grad has a gradient accumulator");
    }
  release(full_);
  unbind();
}

// Note [Flat parameters]: each parameter's TensorImpl is pointed at its place in
// `buffer`, bypassing set_() so that no version counter moves.
void FlatParameter::bind(const at::Tensor& buffer) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto* impl = params_[i].unsafeGetTensorImpl();
    impl->set_allow_tensor_metadata_change(true);
    impl->set_storage_and_dtype(buffer.storage(), buffer.dtype());
    impl->set_sizes_contiguous(shapes_[i]);
    impl->set_storage_offset(offsets_[i]);
  }
}

// Note [Freeing in place]: empty while the unit is not gathered, so that reading a
// parameter outside its unit fails with a shape error instead of reading freed memory.
void FlatParameter::unbind() {
  for (auto& p : params_) {
    auto* impl = p.unsafeGetTensorImpl();
    impl->set_storage_and_dtype(full_.storage(), full_.dtype());
    impl->set_sizes_contiguous({0});
    impl->set_storage_offset(0);
  }
}

// Note [Freeing in place]
void FlatParameter::allocate(const at::Tensor& buffer) const {
  auto* storage = buffer.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<std::size_t>(buffer.numel()) * buffer.element_size();
  TORCH_INTERNAL_ASSERT(storage->allocator() != nullptr, "a flat parameter's buffer has an allocator");
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void FlatParameter::release(const at::Tensor& buffer) const {
  auto* storage = buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, buffer.device()));
  storage->set_nbytes(0);
}

std::int64_t FlatParameter::numel(std::size_t i) const {
  std::int64_t n = 1;
  for (auto d : shapes_[i]) n *= d;
  return n;
}

bool FlatParameter::gathered() const {
  return allocated_ && !in_flight_ && gathered_version_ == shard_._version() && gathered_epoch_ == epoch_;
}

void FlatParameter::invalidate() { ++epoch_; }

void FlatParameter::start_gather() {
  if (in_flight_ || gathered()) return;
  if (!allocated_) {
    allocate(full_);
    allocated_ = true;
  }
  send_ = bits(shard_.detach().to(compute_dtype_));
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world_; ++r) parts.push_back(bits(full_.narrow(0, r * chunk_, chunk_)));
  gathered_version_ = shard_._version();
  gathered_epoch_ = epoch_;
  pending_ = group_.all_gather_into_async(send_, std::move(parts));
  in_flight_ = true;
}

void FlatParameter::finish_gather() {
  start_gather();
  if (!in_flight_) return;
  const auto started = gathered_version_;
  in_flight_ = false;  // a failed wait leaves the buffer unfilled: gather again next time
  gathered_version_ = -1;
  pending_.wait();
  send_ = at::Tensor();
  gathered_version_ = started;
  bind(full_);
  // A prefetch started before an optimizer step holds the old values: gather again
  // (every rank stepped, so every rank does).
  if (!gathered()) finish_gather();
}

bool FlatParameter::holds(const at::Tensor& t) const {
  return t.defined() && t.has_storage() &&
         t.storage().unsafeGetStorageImpl() == full_.storage().unsafeGetStorageImpl();
}

void FlatParameter::reshard() {
  if (in_flight_) {
    in_flight_ = false;
    send_ = at::Tensor();
    pending_.wait();
  }
  if (!allocated_) return;
  release(full_);
  unbind();
  allocated_ = false;
  gathered_version_ = -1;
}

std::int64_t FlatParameter::gathered_bytes() const {
  return allocated_ ? static_cast<std::int64_t>(full_.numel()) * full_.element_size() : 0;
}

void FlatParameter::gather_state() {
  reshard();
  state_full_ = at::empty({chunk_ * world_}, shard_.options().requires_grad(false));
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world_; ++r) parts.push_back(state_full_.narrow(0, r * chunk_, chunk_));
  for (auto& part : parts) part = bits(part);
  group_.all_gather_into_async(bits(shard_.detach()), std::move(parts)).wait();
  bind(state_full_);
}

std::string FlatParameter::write_back_error() const {
  if (!state_full_.defined()) return {};
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].numel() != numel(i))
      return fmt::format("cohort fully_shard: parameter '{}' was given {} elements inside full_parameters(true), but "
                         "it has {}; load a state of the same model. Nothing was written back: the shards hold "
                         "the values from before full_parameters()",
                         names_[i], params_[i].numel(), numel(i));
  return {};
}

void FlatParameter::release_state(bool write_back) {
  if (!state_full_.defined()) return;
  if (write_back) {
    at::NoGradGuard no_grad;
    // A parameter given new storage meanwhile (torch::load's set_(), a
    // set_data()) is copied back from wherever it points now.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i];
      if (p.storage().unsafeGetStorageImpl() == state_full_.storage().unsafeGetStorageImpl() &&
          p.storage_offset() == offsets_[i])
        continue;
      if (p.numel() != numel(i)) {
        unbind();
        state_full_ = at::Tensor();
        throw ConfigError(fmt::format("cohort fully_shard: parameter '{}' was given {} elements inside "
                                      "full_parameters(), but it has {}; load a state of the same model",
                                      names_[i], p.numel(), numel(i)));
      }
      state_full_.narrow(0, offsets_[i], numel(i)).copy_(p.reshape({-1}));
    }
    shard_.copy_(state_full_.narrow(0, rank_ * chunk_, chunk_));
    invalidate();
  }
  unbind();
  state_full_ = at::Tensor();
}

}  // namespace cohort::zero
