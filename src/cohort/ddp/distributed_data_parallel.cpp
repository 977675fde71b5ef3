#include "cohort/ddp/distributed_data_parallel.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <set>
#include <unordered_map>

#include "cohort/ddp/broadcast.h"
#include "cohort/ddp/replica_check.h"
#include "cohort/ddp/sync_batch_norm.h"
#include "cohort/errors.h"

namespace cohort::ddp {

namespace {

void validate(const DistributedDataParallelOptions& o) {
  if (o.bucket_cap_bytes() <= 0)
    throw ConfigError(fmt::format("cohort DDP: bucket_cap_bytes must be positive, got {}", o.bucket_cap_bytes()));
  if (o.first_bucket_cap_bytes() <= 0)
    throw ConfigError(
        fmt::format("cohort DDP: first_bucket_cap_bytes must be positive, got {}", o.first_bucket_cap_bytes()));
}

// Trainable parameters, each once: a tensor shared by two layers appears under both
// names in named_parameters(), but it has one gradient and is reduced once.
void trainable_parameters(const torch::nn::Module& module, std::vector<at::Tensor>& params,
                          std::vector<std::string>& names) {
  std::unordered_map<const void*, std::size_t> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const auto& p = item.value();
    if (!p.requires_grad()) continue;
    auto [it, fresh] = seen.emplace(p.unsafeGetTensorImpl(), params.size());
    if (!fresh) {
      names[it->second] += " (shared with " + item.key() + ")";
      continue;
    }
    params.push_back(p);
    names.push_back(item.key());
  }
}

std::vector<std::pair<const void*, bool>> parameter_layout(const torch::nn::Module& module) {
  std::vector<std::pair<const void*, bool>> out;
  for (const auto& p : module.parameters(/*recurse=*/true)) out.emplace_back(p.unsafeGetTensorImpl(), p.requires_grad());
  return out;
}

std::vector<at::Tensor> unique_tensors(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  std::vector<at::Tensor> out;
  for (const auto& t : tensors)
    if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  return out;
}

}  // namespace

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                         comm::Group group, DistributedDataParallelOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  if (!module_) throw ConfigError("cohort DDP: the module to wrap is null");
  if (!group_.is_member())
    throw ConfigError("cohort DDP: this rank is not a member of the group it was given; pass a group this "
                      "rank belongs to (world.group(), or the handle new_group returned on a member)");
  validate(options_);

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  trainable_parameters(*module_, params, names);

  bool one_device = true;
  for (const auto& p : params) one_device = one_device && p.device() == params.front().device();
  if (one_device && !params.empty()) device_ = params.front().device();
  if (group_.backend_name() == "nccl")
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!params[i].is_cuda())
        throw ConfigError(fmt::format(
            "cohort DDP (rank {}): parameter '{}' is on {} but the group's backend is NCCL, which only moves "
            "CUDA tensors. Move the model first: model->to(world.device())",
            group_.rank(), names[i], params[i].device().str()));

  if (options_.check_replicas() && group_.size() > 1)
    verify_replicas(group_, describe_parameters(*module_), ReplicaCheckWording(),
                    params.empty() ? c10::Device(c10::kCPU) : params.front().device());
  buffers_ = unique_tensors(module_->buffers(/*recurse=*/true));
  if (group_.size() > 1) {
    std::vector<at::Tensor> state = unique_tensors(module_->parameters(/*recurse=*/true));
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    broadcast_coalesced(group_, state, 0);
  }
  divisor_ = group_.size();
  for (const auto& p : params) reduced_.insert(p.unsafeGetTensorImpl());
  last_seen_ = parameter_layout(*module_);
  for (const auto& [impl, trainable] : last_seen_) constructed_with_.insert(impl);
  reducer_ = std::make_unique<Reducer>(std::move(params), std::move(names), group_, options_);
}

// Note [The trainable set is fixed at construction]
// DDP hooks, buckets and checks across ranks the parameters that require grad when
// it is constructed. A parameter that starts to require grad later (unfrozen for
// fine-tuning) or is registered later would train on each rank's own gradient, and
// the replicas would drift apart silently, as they do under PyTorch's DDP. So every
// forward with grad enabled compares the module's parameters with the last ones it
// saw (one pass over module->parameters(), no collective) and refuses a parameter
// DDP does not reduce that requires grad. Freezing a parameter DDP reduces is
// allowed: it gets no gradient, which find_unused_parameters handles (and which is
// an error naming it without).
void DistributedDataParallelBase::check_trainable_set() {
  auto now = parameter_layout(*module_);
  if (now == last_seen_) return;
  std::vector<std::string> unfrozen, added;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const auto* impl = item.value().unsafeGetTensorImpl();
    if (!item.value().requires_grad() || reduced_.count(impl)) continue;
    (constructed_with_.count(impl) ? unfrozen : added).push_back(item.key());
  }
  if (unfrozen.empty() && added.empty()) {
    last_seen_ = std::move(now);  // frozen or removed parameters: nothing to refuse
    return;
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
    return out;
  };
  std::string what;
  if (!unfrozen.empty()) what = fmt::format("{} required no grad when DDP was constructed and require it now", list(unfrozen));
  if (!added.empty())
    what += fmt::format("{}{} {} registered after DDP was constructed (or replaced by another tensor)",
                        what.empty() ? "" : "; ", list(added), added.size() == 1 ? "was" : "were");
  throw ConfigError(fmt::format(
      "cohort DDP (rank {}): the set of trainable parameters changed after DDP was constructed: parameter(s) {}. "
      "DDP reduces only the parameters that required grad at its construction, so these would train on each "
      "rank's own gradient and the replicas would drift apart. Fix: construct the DistributedDataParallel wrapper "
      "again after changing which parameters train (unfreeze or add them before wrapping)",
      group_.rank(), what));
}

DistributedDataParallelBase::~DistributedDataParallelBase() = default;

void DistributedDataParallelBase::check_input_devices(const std::vector<at::Tensor>& inputs) const {
  if (!device_) return;  // parameters on several devices: model parallel, inputs go anywhere
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& t = inputs[i];
    if (!t.defined() || t.device() == *device_) continue;
    if (t.dim() == 0 && t.is_cpu()) continue;  // CPU scalars mix with any device
    throw ConfigError(fmt::format(
        "cohort DDP (rank {}): forward input {} is on {} but the model's parameters are on {}. Move the input "
        "first: input.to({})",
        group_.rank(), i, t.device().str(), device_->str(), device_->str()));
  }
}

void DistributedDataParallelBase::before_forward(const std::vector<at::Tensor>& inputs) {
  reducer_->settle();  // Note [A step that failed]: before any collective of this forward
  check_input_devices(inputs);
  const bool grad = at::GradMode::is_enabled();
  if (grad) check_trainable_set();
  // Note [When buffers are synchronised]
  const bool sync_buffers = options_.broadcast_buffers() && buffers_due_ && !buffers_.empty();
  buffers_due_ = grad && require_sync_;
  int root = 0;
  divisor_ = group_.size();
  if (join_.active) {
    auto round = join_round(true, grad, grad && require_sync_, sync_buffers);
    root = round.authoritative();
    if (!join_.options.divide_by_initial_world_size()) divisor_ = round.active();
  }
  if (grad) reducer_->prepare_for_forward();
  if (sync_buffers) broadcast_coalesced(group_, buffers_, root);
}

void DistributedDataParallelBase::after_forward(const std::vector<at::Tensor>& outputs) {
  if (!at::GradMode::is_enabled()) return;
  reducer_->prepare_for_backward(outputs, require_sync_, divisor_);
}

JoinRound DistributedDataParallelBase::join_round(bool active, bool grad_enabled, bool sync, bool sync_buffers) {
  auto t = encode_join_round(group_.size(), group_.rank(), active, grad_enabled, sync, sync_buffers)
               .to(reducer_->parameters().front().device());
  group_.all_reduce(t);
  auto round = decode_join_round(t, group_.size());
  if (round.active() > 0) join_.last_round = round;
  return round;
}

void DistributedDataParallelBase::join(const std::function<void()>& loop, JoinOptions options) {
  if (join_.active) throw ConfigError("cohort DDP: join() is already running; it does not nest");
  // Note [Join] mirrors DDP's own collectives only; SyncBatchNorm's would pair with
  // the wrong ones on ranks that have joined.
  for (const auto& m : module_->modules(/*include_self=*/true))
    if (dynamic_cast<const SyncBatchNormImpl*>(m.get()))
      throw ConfigError("cohort DDP: join() cannot mirror SyncBatchNorm's collectives for ranks that ran out of "
                        "data; give every rank the same number of batches (e.g. DistributedSampler with "
                        "drop_last) or use BatchNorm");
  join_ = JoinState{true, options, std::nullopt};
  try {
    loop();
    shadow_until_all_joined();
  } catch (...) {
    join_.active = false;  // a failed join leaves later forwards ordinary
    throw;
  }
}

void DistributedDataParallelBase::shadow_until_all_joined() {
  reducer_->settle();  // this rank's last step, if its backward failed
  while (true) {
    auto round = join_round(false, false, false, false);
    if (round.active() == 0) break;
    if (round.grad_enabled) reducer_->prepare_for_forward();
    if (round.sync_buffers) broadcast_coalesced(group_, buffers_, round.authoritative());
    if (round.sync)
      reducer_->shadow_backward(join_.options.divide_by_initial_world_size() ? group_.size() : round.active());
  }
  join_.active = false;
  if (join_.last_round) {
    std::vector<at::Tensor> state = unique_tensors(module_->parameters(/*recurse=*/true));
    state.insert(state.end(), buffers_.begin(), buffers_.end());
    broadcast_coalesced(group_, state, join_.last_round->authoritative());
  }
  buffers_due_ = true;  // the same on every rank, whatever each did before joining
}

}  // namespace cohort::ddp
