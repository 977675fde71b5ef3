#include "cohort/zero/fully_shard.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <map>
#include <ostream>
#include <set>
#include <tuple>
#include <unordered_map>

#include "cohort/ddp/broadcast.h"
#include "cohort/ddp/replica_check.h"
#include "cohort/errors.h"

namespace cohort::zero {

ShardedUnitBase::ShardedUnitBase(std::shared_ptr<torch::nn::Module> inner) : inner_(std::move(inner)) {
  TORCH_CHECK(inner_ != nullptr, "cohort::zero::FullyShard needs a module to wrap, not null");
  // Transparent: the wrapped module's own names, so state dicts read as unwrapped.
  for (const auto& p : inner_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().defined() && p.value().requires_grad());
  for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
}

void ShardedUnitBase::train(bool on) {
  torch::nn::Module::train(on);
  inner_->train(on);
}

void ShardedUnitBase::pretty_print(std::ostream& stream) const {
  stream << "cohort::zero::FullyShard(";
  inner_->pretty_print(stream);
  stream << ")";
}

void ShardedUnitBase::attach(std::shared_ptr<ShardSchedule> schedule, std::size_t index) {
  schedule_ = std::move(schedule);
  index_ = index;
}

at::Tensor ShardedUnitBase::cast_tensor(const at::Tensor& t) const {
  if (!schedule_ || !schedule_->options().param_dtype() || !t.defined() || !t.is_floating_point()) return t;
  const auto dtype = *schedule_->options().param_dtype();
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

namespace {

struct Found {
  std::vector<std::shared_ptr<ShardedUnitBase>> units;  // pre-order
  std::vector<std::string> names;
  std::vector<int> parent;  // -1 for the root
  // Every registration of a defined parameter: the tensor, its path, the innermost unit.
  std::vector<std::tuple<at::Tensor, std::string, std::size_t>> params;
  std::vector<at::Tensor> buffers;
};

void walk(const std::shared_ptr<torch::nn::Module>& module, const std::string& path, std::size_t unit, Found& found) {
  for (const auto& p : module->named_parameters(/*recurse=*/false))
    if (p.value().defined()) found.params.emplace_back(p.value(), path + p.key(), unit);
  for (const auto& b : module->named_buffers(/*recurse=*/false))
    if (b.value().defined()) found.buffers.push_back(b.value());
  for (const auto& c : module->named_children()) {
    std::size_t inner = unit;
    if (auto u = std::dynamic_pointer_cast<ShardedUnitBase>(c.value())) {
      inner = found.units.size();
      found.units.push_back(u);
      found.names.push_back(path + c.key());
      found.parent.push_back(static_cast<int>(unit));
    }
    walk(c.value(), path + c.key() + ".", inner, found);
  }
}

// The innermost unit that contains both.
std::size_t common_unit(std::size_t a, std::size_t b, const std::vector<int>& parent) {
  std::set<std::size_t> chain;
  for (int u = static_cast<int>(a); u >= 0; u = parent[u]) chain.insert(static_cast<std::size_t>(u));
  for (int u = static_cast<int>(b); u >= 0; u = parent[u])
    if (chain.count(static_cast<std::size_t>(u))) return static_cast<std::size_t>(u);
  return 0;
}

std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

}  // namespace

FullyShardedModel fully_shard(const std::shared_ptr<ShardedUnitBase>& root, comm::Group group,
                              FullyShardOptions options) {
  TORCH_CHECK(root != nullptr, "cohort::zero::fully_shard needs a model, not null");
  Found found;
  found.units.push_back(root);
  found.names.push_back("");
  found.parent.push_back(-1);
  walk(root, "", 0, found);
  // Each parameter (by identity) to the innermost unit holding all its registrations.
  std::unordered_map<const void*, std::size_t> index;
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;
  std::vector<std::size_t> owner;
  for (const auto& [tensor, name, unit] : found.params) {
    auto [it, fresh] = index.emplace(tensor.unsafeGetTensorImpl(), tensors.size());
    if (fresh) {
      tensors.push_back(tensor);
      names.push_back(name);
      owner.push_back(unit);
    } else {
      owner[it->second] = common_unit(owner[it->second], unit, found.parent);
    }
  }

  // Note [Replica check without hangs]: first, while every rank still agrees to talk.
  if (options.check_replicas()) {
    std::vector<ddp::ParamDescription> described;
    described.push_back({"FullyShardOptions (reshard_after_forward, prefetch, param_dtype, reduce_dtype)",
                         {options.reshard_after_forward(), options.prefetch(),
                          options.param_dtype() ? static_cast<std::int64_t>(*options.param_dtype()) : -1,
                          options.reduce_dtype() ? static_cast<std::int64_t>(*options.reduce_dtype()) : -1},
                         "-"});
    for (std::size_t u = 0; u < found.units.size(); ++u)
      described.push_back({fmt::format("unit '{}'", found.names[u]), {static_cast<std::int64_t>(u)}, "-"});
    for (std::size_t i = 0; i < tensors.size(); ++i)
      described.push_back({fmt::format("{} (in unit '{}')", names[i], found.names[owner[i]]), tensors[i].sizes().vec(),
                           dtype_name(tensors[i].scalar_type()) + (tensors[i].requires_grad() ? "" : ", frozen")});
    ddp::verify_replicas(group, described,
                         {"cohort fully_shard", "the model or the options",
                          "build the same model, with the same FullyShard units, and pass the same "
                          "FullyShardOptions on every rank"},
                         tensors.empty() ? at::Device(at::kCPU) : tensors.front().device());
  }
  for (std::size_t u = 0; u < found.units.size(); ++u)
    if (found.units[u]->attached())
      throw ConfigError(fmt::format("cohort fully_shard: unit '{}' is already fully sharded; call fully_shard() once, "
                                    "on the outermost unit, and keep the FullyShardedModel it returns",
                                    found.names[u]));
  if (options.param_dtype())
    for (const auto& b : found.buffers)
      if (b.is_floating_point() && b.scalar_type() != *options.param_dtype())
        throw ConfigError(fmt::format(
            "cohort fully_shard: param_dtype({}) casts the parameters but not the buffers, and the model has a "
            "floating-point buffer of shape {} ({}; BatchNorm's running statistics, say), which its layer would "
            "then mix with {} parameters; compute in lower precision with autocast (cohort::amp, --amp bf16) "
            "instead of param_dtype",
            c10::toString(*options.param_dtype()), c10::str(b.sizes()), c10::toString(b.scalar_type()),
            c10::toString(*options.param_dtype())));

  const auto reduce = options.reduce_dtype() ? options.reduce_dtype() : options.param_dtype();
  if (reduce && *reduce == at::kBFloat16 && group.backend_name() == "gloo")
    throw ConfigError("cohort fully_shard: Gloo cannot reduce bfloat16 gradients (LibTorch 1.13's Gloo has no "
                      "bfloat16 sum); pass FullyShardOptions().reduce_dtype(torch::kFloat32) to keep bfloat16 "
                      "compute with float32 reductions, or use NCCL");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].device() != tensors[0].device())
      throw ConfigError(fmt::format("cohort fully_shard: parameter '{}' is on {} but '{}' is on {}; move the whole "
                                    "model to one device before fully_shard()",
                                    names[i], tensors[i].device().str(), names[0], tensors[0].device().str()));
  if (!found.buffers.empty()) {
    at::NoGradGuard no_grad;
    ddp::broadcast_coalesced(group, found.buffers, 0);  // the parameters travel flat by flat
  }

  auto schedule = std::make_shared<ShardSchedule>(group, options);
  for (std::size_t u = 0; u < found.units.size(); ++u) {
    // One flat per (requires grad, dtype), in the order the parameters come.
    std::map<std::pair<bool, int>, std::pair<std::vector<at::Tensor>, std::vector<std::string>>> groups;
    std::vector<std::pair<bool, int>> order;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (owner[i] != u) continue;
      std::pair<bool, int> key{tensors[i].requires_grad(), static_cast<int>(tensors[i].scalar_type())};
      if (!groups.count(key)) order.push_back(key);
      groups[key].first.push_back(tensors[i]);
      groups[key].second.push_back(names[i]);
    }
    std::vector<std::unique_ptr<FlatParameter>> flats;
    for (const auto& key : order)
      flats.push_back(std::make_unique<FlatParameter>(groups[key].first, groups[key].second, group,
                                                      options.param_dtype()));
    schedule->add_unit(found.names[u], std::move(flats));
  }
  std::unordered_map<const void*, ShardSchedule::Place> place;
  for (std::size_t f = 0; f < schedule->flats().size(); ++f)
    for (std::size_t i = 0; i < schedule->flats()[f]->params().size(); ++i)
      place.emplace(schedule->flats()[f]->params()[i].unsafeGetTensorImpl(), ShardSchedule::Place{f, i});
  std::vector<ShardSchedule::Place> whole;
  std::set<const void*> listed;
  for (const auto& p : root->parameters()) {
    auto it = place.find(p.unsafeGetTensorImpl());
    if (it == place.end()) continue;
    if (listed.insert(it->first).second) whole.push_back(it->second);
  }
  schedule->set_whole_order(std::move(whole));
  schedule->start();
  for (std::size_t u = 0; u < found.units.size(); ++u) found.units[u]->attach(schedule, u);
  return FullyShardedModel(schedule);
}

std::vector<at::Tensor> FullyShardedModel::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& f : schedule_->flats())
    if (f->trainable()) out.push_back(f->shard());
  return out;
}

FullyShardedModel::NoSync::NoSync(ShardSchedule& schedule) : schedule_(schedule) { schedule_.set_sync(false); }
FullyShardedModel::NoSync::~NoSync() {
  try {
    schedule_.set_sync(true);
  } catch (...) {
    // Left during a backward: the error was raised when it was entered wrongly, or
    // the next set_sync reports it.
  }
}
FullyShardedModel::NoSync FullyShardedModel::no_sync() { return NoSync(*schedule_); }

FullyShardedModel::FullParameters::FullParameters(ShardSchedule& schedule, bool write_back)
    : schedule_(schedule), write_back_(write_back) {
  schedule_.raise_recorded_failure();
  schedule_.reshard_all("full_parameters() was called");
  try {
    for (const auto& f : schedule_.flats()) f->gather_state();
  } catch (...) {
    for (const auto& f : schedule_.flats()) f->release_state(false);
    throw;
  }
}
// Note [Leaving full_parameters()]
// Writing back can fail (a torch::load of another model's file gave a parameter
// another size). Every flat is checked first, so the shards take all of the new
// values or none. close() throws that failure; the destructor must not (a throw
// while leaving a scope ends the process, or unwinds past a pending exception), so
// it prints it and records it in the schedule, and the next forward, step or
// full_parameters() throws it.
void FullyShardedModel::FullParameters::close() {
  if (closed_) return;
  closed_ = true;
  std::string error;
  if (write_back_)
    for (const auto& f : schedule_.flats())
      if (error.empty()) error = f->write_back_error();
  for (const auto& f : schedule_.flats()) f->release_state(write_back_ && error.empty());
  if (!error.empty()) throw ConfigError(error);
}

FullyShardedModel::FullParameters::~FullParameters() {
  try {
    close();
  } catch (const std::exception& e) {
    std::cerr << e.what() << " (raised on leaving full_parameters(); the next forward, step or full_parameters() "
                 "raises it; call close() to catch it where it happens)"
              << std::endl;
    schedule_.record_failure(e.what());
  }
}
FullyShardedModel::FullParameters FullyShardedModel::full_parameters(bool write_back) {
  return FullParameters(*schedule_, write_back);
}

double FullyShardedModel::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  auto sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
  at::Device device = at::kCPU;
  for (const auto& p : parameters()) {
    device = p.device();
    if (p.grad().defined()) sum += p.grad().to(at::kDouble).pow(2).sum().to(at::kCPU);
  }
  auto total = sum.to(device);
  auto group = schedule_->group();
  group.all_reduce(total);
  const double norm = std::sqrt(total.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1)
    for (auto& p : parameters())
      if (p.grad().defined()) p.mutable_grad().mul_(coefficient);
  return norm;
}

std::int64_t FullyShardedModel::local_parameter_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& f : schedule_->flats())
    bytes += static_cast<std::int64_t>(f->shard().nbytes()) + f->gathered_bytes();
  return bytes;
}

std::int64_t FullyShardedModel::local_gradient_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& f : schedule_->flats())
    if (f->shard().grad().defined()) bytes += static_cast<std::int64_t>(f->shard().grad().nbytes());
  return bytes;
}

std::int64_t FullyShardedModel::total_parameters() const {
  std::int64_t n = 0;
  for (const auto& f : schedule_->flats()) n += f->total_numel();
  return n;
}

}  // namespace cohort::zero
