#include "cohort/ddp/powersgd_hook.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::ddp {
namespace {

// The matrices of a bucket that are compressed, and the flat rest.
struct Split {
  std::vector<at::Tensor> matrices;  // n x m views into the bucket
  std::vector<std::int64_t> ranks;   // r of each
  std::vector<std::size_t> owners;   // the parameter of each
  std::vector<at::Tensor> plain;     // views into the bucket, all-reduced whole
};

// The model's index of the bucket's i-th gradient (i itself for a bucket by hand).
std::size_t parameter_of(const GradBucket& bucket, std::size_t i) {
  return bucket.parameters().empty() ? i : bucket.parameters().at(i);
}

Split split(GradBucket& bucket, const PowerSGDOptions& o) {
  Split s;
  const at::Tensor& bucket_bytes = bucket.buffer();
  for (std::size_t i = 0; i < bucket.gradients().size(); ++i) {
    const auto& g = bucket.gradients()[i];
    if (g.dim() <= 1) {
      s.plain.push_back(g);
      continue;
    }
    const auto n = g.size(0), m = g.numel() / std::max<std::int64_t>(n, 1);
    const auto r = std::min({n, m, o.matrix_approximation_rank()});
    // The matrix over the gradient's own bytes in the bucket. A channels-last weight
    // keeps its first dimension outermost, so its bytes are the n x m matrix with
    // the columns permuted, which changes no low-rank approximation; a layout whose
    // first dimension is not outermost travels whole.
    at::Tensor matrix;
    if (g.is_contiguous())
      matrix = g.view({n, m});
    else if (g.is_non_overlapping_and_dense() && g.stride(0) == m)
      matrix = bucket_bytes.narrow(0, g.storage_offset() - bucket_bytes.storage_offset(), g.numel()).view({n, m});
    // PyTorch's rule: compress only when it shrinks the matrix by the rate.
    if (matrix.defined() &&
        static_cast<double>((n + m) * r) * o.min_compression_rate() < static_cast<double>(n * m)) {
      s.matrices.push_back(matrix);
      s.ranks.push_back(r);
      s.owners.push_back(parameter_of(bucket, i));
    } else {
      s.plain.push_back(g);
    }
  }
  return s;
}

at::Tensor flatten(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.reshape(-1));
  return at::cat(flat);
}

void unflatten_into(const at::Tensor& flat, std::vector<at::Tensor>& parts) {
  std::int64_t offset = 0;
  for (auto& p : parts) {
    p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

}  // namespace

void orthogonalize_columns(at::Tensor& matrix_in, double epsilon) {
  // In double precision: Gram-Schmidt loses orthogonality as eps times the square of
  // the matrix's condition, about 1e-5 in float32 for a random 64 x 32 matrix. P and
  // Q are thin (r columns), so this costs little.
  auto matrix = matrix_in.to(at::kDouble);
  const auto r = matrix.size(1);
  for (std::int64_t i = 0; i < r; ++i) {
    auto col = matrix.narrow(1, i, 1);
    const auto norm = col.norm();
    if (epsilon == 0)
      // A zero column stays zero (PyTorch would make it NaN), without reading the
      // norm back to the host: no device sync per column.
      col.copy_(at::where(norm == 0, at::zeros_like(col), col / norm));
    else
      col.div_(norm + epsilon);
    if (i + 1 < r) {
      auto rest = matrix.narrow(1, i + 1, r - i - 1);
      rest.sub_((col * rest).sum(0, /*keepdim=*/true) * col);
    }
  }
  matrix_in.copy_(matrix);
}

PowerSGDHook::PowerSGDHook(PowerSGDOptions options)
    : options_(std::move(options)), generator_(at::detail::createCPUGenerator(options_.random_seed())) {
  if (options_.matrix_approximation_rank() < 1)
    throw ConfigError(fmt::format("cohort PowerSGD: matrix_approximation_rank must be at least 1, got {}",
                                  options_.matrix_approximation_rank()));
  if (options_.start_powerSGD_iter() < 0 || options_.min_compression_rate() < 0 ||
      options_.orthogonalization_epsilon() < 0)
    throw ConfigError("cohort PowerSGD: start_powerSGD_iter, min_compression_rate and orthogonalization_epsilon "
                      "must not be negative");
  // As PyTorch: DDP rebuilds its buckets after the first step, and the memories are
  // kept per bucket, so compression may start at the third step at the earliest.
  if (options_.start_powerSGD_iter() <= 1 && (options_.use_error_feedback() || options_.warm_start()))
    throw ConfigError(fmt::format("cohort PowerSGD: start_powerSGD_iter {} with error feedback or warm start: "
                                  "DDP rebuilds its buckets after the first step, so it must be at least 2",
                                  options_.start_powerSGD_iter()));
}

at::Tensor PowerSGDHook::error_memory(std::size_t index) const {
  auto it = memory_.find(index);
  return it == memory_.end() ? at::Tensor() : it->second.error;
}

BucketWork PowerSGDHook::start(comm::Group& group, GradBucket& bucket) {
  if (bucket.index() == 0) current_ = Traffic{};
  const bool plain_step = iteration_ < options_.start_powerSGD_iter();
  if (bucket.is_last()) ++iteration_;
  auto buffer = bucket.buffer();
  current_.dense += buffer.numel();
  auto finish_traffic = [this, last = bucket.is_last()] {
    if (last) traffic_ = current_;
  };
  if (plain_step) {
    // Note [PowerSGD step]: bitwise the default hook.
    current_.uncompressed += buffer.numel();
    finish_traffic();
    if (group.size() == 1) return BucketWork();
    return BucketWork(group.all_reduce_async(buffer));
  }
  device_ = buffer.device();

  // Memories per parameter (Note [PowerSGD step]); a std::map's nodes stay put, so
  // the pointers hold in the final step below. A shape that changed starts afresh.
  const auto& gradients = bucket.gradients();
  std::vector<Memory*> memories;
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    Memory& m = memory_[parameter_of(bucket, i)];
    if (m.shape != gradients[i].sizes().vec()) m = Memory{{}, {}, gradients[i].sizes().vec()};
    memories.push_back(&m);
  }
  auto inputs = std::make_shared<std::vector<at::Tensor>>();
  if (options_.use_error_feedback()) {
    for (std::size_t i = 0; i < gradients.size(); ++i) {
      auto g = gradients[i];
      if (memories[i]->error.defined()) g.add_(memories[i]->error.to(g.options()));
      inputs->push_back(g.clone());
    }
  }
  auto s = std::make_shared<Split>(split(bucket, options_));
  std::vector<comm::Pending> pending;
  at::Tensor plain;
  if (!s->plain.empty()) {
    plain = flatten(s->plain);
    current_.uncompressed += plain.numel();
    pending.push_back(group.all_reduce_async(plain));
  }
  // Each matrix's Q: last step's (warm start) while its shape fits, else fresh; then
  // orthogonalised, as PyTorch does.
  std::vector<at::Tensor> qs;
  for (std::size_t i = 0; i < s->matrices.size(); ++i) {
    at::Tensor q = memory_[s->owners[i]].q;
    const bool fits = q.defined() && q.size(0) == s->matrices[i].size(1) && q.size(1) == s->ranks[i];
    if (!options_.warm_start() || !fits)
      q = at::randn({s->matrices[i].size(1), s->ranks[i]}, generator_, at::TensorOptions().dtype(at::kFloat));
    // A copy on the buckets' device (a fresh one, or one loaded from a checkpoint, is
    // on the CPU): the memory changes only in the final step (Note [Non-finite buckets]).
    q = q.to(buffer.options(), /*non_blocking=*/false, /*copy=*/true);
    orthogonalize_columns(q, options_.orthogonalization_epsilon());
    qs.push_back(q);
  }
  auto ps = std::make_shared<std::vector<at::Tensor>>();
  for (std::size_t i = 0; i < s->matrices.size(); ++i) {
    ps->push_back(at::matmul(s->matrices[i], qs[i]));
    current_.compressed += (s->matrices[i].size(0) + s->matrices[i].size(1)) * s->ranks[i];
  }
  at::Tensor flat_p = ps->empty() ? at::Tensor() : flatten(*ps);
  if (flat_p.defined()) pending.push_back(group.all_reduce_async(flat_p));
  finish_traffic();

  auto handle = group;  // a handle: the second all-reduce runs when DDP waits
  const double epsilon = options_.orthogonalization_epsilon();
  const double divisor = bucket.divisor();
  return BucketWork(std::move(pending), [this, memories, gradients, inputs, s, ps, plain, flat_p, handle, epsilon,
                                         divisor]() mutable {
    // Note [Non-finite buckets]: whether any rank's bucket held inf or NaN, read off
    // the reduced tensors, which are the same on every rank.
    std::vector<at::Tensor> reduced;
    if (plain.defined()) {
      unflatten_into(plain, s->plain);
      reduced.push_back(plain);
    }
    std::vector<at::Tensor> qs;
    if (flat_p.defined()) {
      reduced.push_back(flat_p);
      unflatten_into(flat_p, *ps);
      for (std::size_t i = 0; i < ps->size(); ++i) {
        orthogonalize_columns((*ps)[i], epsilon);
        qs.push_back(at::matmul(s->matrices[i].t(), (*ps)[i]));
      }
      auto flat_q = flatten(qs);
      handle.all_reduce(flat_q);  // always: every rank runs the same collectives
      reduced.push_back(flat_q);
      unflatten_into(flat_q, qs);
      for (std::size_t i = 0; i < ps->size(); ++i) s->matrices[i].copy_(at::matmul((*ps)[i], qs[i].t()));
    }
    bool finite = true;
    if (!reduced.empty()) {
      auto all = at::isfinite(reduced[0]).all();
      for (std::size_t i = 1; i < reduced.size(); ++i) all = at::logical_and(all, at::isfinite(reduced[i]).all());
      finite = all.item<bool>();
    }
    if (!finite) return;  // the bucket holds inf or NaN for the GradScaler to see; memories as they were
    for (std::size_t i = 0; i < qs.size(); ++i) memory_[s->owners[i]].q = qs[i];
    // PyTorch keeps (g + e) - average; in the bucket's divided units that is
    // x - (the reduced gradient) / divisor.
    for (std::size_t i = 0; i < inputs->size(); ++i)
      memories[i]->error = ((*inputs)[i] - gradients[i] / divisor).contiguous();  // a channels-last one too
  });
}

std::map<std::string, at::Tensor> PowerSGDHook::state_dict(comm::Group& group) const {
  std::map<std::string, at::Tensor> out;
  out["iteration"] = at::tensor({iteration_}, at::kLong);
  out["world_size"] = at::tensor({static_cast<std::int64_t>(group.size())}, at::kLong);
  out["generator"] = generator_.get_state();
  auto device = device_;
  if (group.backend_name() == "nccl" && !device.is_cuda()) device = c10::Device(c10::kCUDA);
  for (const auto& [parameter, memory] : memory_) {
    out[fmt::format("shape.{}", parameter)] = at::tensor(memory.shape, at::kLong);
    if (memory.q.defined()) out[fmt::format("q.{}", parameter)] = memory.q.cpu();
    if (!memory.error.defined()) continue;
    // Every rank's error memory: the same collectives on every rank, since the
    // parameters and their compressed steps are the same everywhere. On the
    // buckets' device (NCCL gathers nothing else), also right after a load.
    auto errors = group.all_gather(memory.error.to(device).contiguous());
    for (std::size_t r = 0; r < errors.size(); ++r) out[fmt::format("error.{}.{}", parameter, r)] = errors[r].cpu();
  }
  return out;
}

bool PowerSGDHook::load_state_dict(const std::map<std::string, at::Tensor>& state, comm::Group& group) {
  auto get = [&](const std::string& key) {
    auto it = state.find(key);
    if (it == state.end())
      throw ConfigError(fmt::format("cohort PowerSGD: the saved state has no '{}'; it was not saved by "
                                    "PowerSGDHook::state_dict",
                                    key));
    return it->second;
  };
  iteration_ = get("iteration").item<std::int64_t>();
  generator_.set_state(get("generator"));
  const bool same_world = get("world_size").item<std::int64_t>() == group.size();
  memory_.clear();
  for (const auto& [key, tensor] : state) {
    unsigned long parameter = 0, rank = 0;
    if (std::sscanf(key.c_str(), "error.%lu.%lu", &parameter, &rank) == 2) {
      if (same_world && static_cast<int>(rank) == group.rank()) memory_[parameter].error = tensor.clone();
    } else if (std::sscanf(key.c_str(), "shape.%lu", &parameter) == 1) {
      auto shape = tensor.to(at::kLong).contiguous();
      memory_[parameter].shape.assign(shape.data_ptr<std::int64_t>(), shape.data_ptr<std::int64_t>() + shape.numel());
    } else if (std::sscanf(key.c_str(), "q.%lu", &parameter) == 1) {
      memory_[parameter].q = tensor.clone();
    }
  }
  return same_world;
}

std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options) {
  return std::make_shared<PowerSGDHook>(std::move(options));
}

}  // namespace cohort::ddp
