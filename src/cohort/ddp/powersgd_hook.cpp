#include "cohort/ddp/powersgd_hook.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::ddp {
namespace {

// The matrices of a bucket that are compressed, and the flat rest.
struct Split {
  std::vector<at::Tensor> matrices;  // n x m views into the bucket
  std::vector<std::int64_t> ranks;   // r of each
  std::vector<at::Tensor> plain;     // views into the bucket, all-reduced whole
};

Split split(const GradBucket& bucket, const PowerSGDOptions& o) {
  Split s;
  for (const auto& g : bucket.gradients()) {
    if (g.dim() <= 1) {
      s.plain.push_back(g);
      continue;
    }
    const auto n = g.size(0), m = g.numel() / std::max<std::int64_t>(n, 1);
    const auto r = std::min({n, m, o.matrix_approximation_rank()});
    // PyTorch's rule: compress only when it shrinks the matrix by the rate.
    if (static_cast<double>((n + m) * r) * o.min_compression_rate() < static_cast<double>(n * m)) {
      s.matrices.push_back(g.view({n, m}));
      s.ranks.push_back(r);
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

void orthogonalize_columns(at::Tensor& matrix, double epsilon) {
  const auto r = matrix.size(1);
  for (std::int64_t i = 0; i < r; ++i) {
    auto col = matrix.narrow(1, i, 1);
    const auto norm = col.norm();
    if (epsilon == 0 && norm.item<double>() == 0)
      col.zero_();  // PyTorch recovers the NaNs of 0/0 as zeros
    else
      col.div_(epsilon == 0 ? norm : norm + epsilon);
    if (i + 1 < r) {
      auto rest = matrix.narrow(1, i + 1, r - i - 1);
      rest.sub_((col * rest).sum(0, /*keepdim=*/true) * col);
    }
  }
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

  // A std::map's nodes stay put: the pointer is safe in the final step below.
  Memory* memory_ptr = &memory_[bucket.index()];
  auto& memory = *memory_ptr;
  at::Tensor input;
  if (options_.use_error_feedback()) {
    if (memory.error.defined() && memory.error.sizes() == buffer.sizes())
      buffer.add_(memory.error.to(buffer.options()));
    else
      memory.error = at::zeros_like(buffer);
    input = buffer.clone();
  }
  auto s = std::make_shared<Split>(split(bucket, options_));
  std::vector<comm::Pending> pending;
  at::Tensor plain;
  if (!s->plain.empty()) {
    plain = flatten(s->plain);
    current_.uncompressed += plain.numel();
    pending.push_back(group.all_reduce_async(plain));
  }
  // Qs: last step's (warm start) when their shapes still fit, else fresh.
  bool fresh = !options_.warm_start() || memory.qs.size() != s->matrices.size();
  for (std::size_t i = 0; !fresh && i < s->matrices.size(); ++i) {
    fresh = memory.qs[i].size(0) != s->matrices[i].size(1) || memory.qs[i].size(1) != s->ranks[i];
    memory.qs[i] = memory.qs[i].to(buffer.options());  // loaded from a checkpoint: on the CPU
  }
  if (fresh) {
    memory.qs.clear();
    for (std::size_t i = 0; i < s->matrices.size(); ++i) {
      auto q = at::randn({s->matrices[i].size(1), s->ranks[i]}, generator_, at::TensorOptions().dtype(at::kFloat))
                   .to(buffer.options());
      orthogonalize_columns(q, options_.orthogonalization_epsilon());
      memory.qs.push_back(q);
    }
  }
  auto ps = std::make_shared<std::vector<at::Tensor>>();
  for (std::size_t i = 0; i < s->matrices.size(); ++i) {
    ps->push_back(at::matmul(s->matrices[i], memory.qs[i]));
    current_.compressed += (s->matrices[i].size(0) + s->matrices[i].size(1)) * s->ranks[i];
  }
  at::Tensor flat_p = ps->empty() ? at::Tensor() : flatten(*ps);
  if (flat_p.defined()) pending.push_back(group.all_reduce_async(flat_p));
  finish_traffic();

  auto handle = group;  // a handle: the second all-reduce runs when DDP waits
  const double epsilon = options_.orthogonalization_epsilon();
  const bool error_feedback = options_.use_error_feedback();
  return BucketWork(std::move(pending), [memory_ptr, s, ps, plain, flat_p, buffer, input, handle, epsilon,
                                         error_feedback]() mutable {
    auto& memory = *memory_ptr;
    if (plain.defined()) unflatten_into(plain, s->plain);
    if (flat_p.defined()) {
      unflatten_into(flat_p, *ps);
      std::vector<at::Tensor> qs;
      for (std::size_t i = 0; i < ps->size(); ++i) {
        orthogonalize_columns((*ps)[i], epsilon);
        qs.push_back(at::matmul(s->matrices[i].t(), (*ps)[i]));
      }
      auto flat_q = flatten(qs);
      handle.all_reduce(flat_q);
      unflatten_into(flat_q, qs);
      for (std::size_t i = 0; i < ps->size(); ++i) s->matrices[i].copy_(at::matmul((*ps)[i], qs[i].t()));
      memory.qs = qs;
    }
    if (error_feedback) memory.error = input - buffer;
  });
}

std::map<std::string, at::Tensor> PowerSGDHook::state_dict(comm::Group& group) const {
  std::map<std::string, at::Tensor> out;
  out["iteration"] = at::tensor({iteration_}, at::kLong);
  out["world_size"] = at::tensor({static_cast<std::int64_t>(group.size())}, at::kLong);
  out["generator"] = generator_.get_state();
  for (const auto& [index, memory] : memory_) {
    for (std::size_t i = 0; i < memory.qs.size(); ++i) out[fmt::format("q.{}.{}", index, i)] = memory.qs[i].cpu();
    if (!memory.error.defined()) continue;
    // Every rank's error memory: the same collectives on every rank, since buckets
    // and their compressed steps are the same everywhere.
    auto errors = group.all_gather(memory.error);
    for (std::size_t r = 0; r < errors.size(); ++r) out[fmt::format("error.{}.{}", index, r)] = errors[r].cpu();
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
    unsigned long index = 0, i = 0;
    if (std::sscanf(key.c_str(), "q.%lu.%lu", &index, &i) == 2) {
      auto& qs = memory_[index].qs;
      if (qs.size() <= i) qs.resize(i + 1);
      qs[i] = tensor.clone();
    } else if (same_world && std::sscanf(key.c_str(), "error.%lu.%lu", &index, &i) == 2 &&
               static_cast<int>(i) == group.rank()) {
      memory_[index].error = tensor.clone();
    }
  }
  return same_world;
}

std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options) {
  return std::make_shared<PowerSGDHook>(std::move(options));
}

}  // namespace cohort::ddp
