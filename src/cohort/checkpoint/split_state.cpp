#include "cohort/checkpoint/split_state.h"

#include <fmt/format.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <sstream>
#include <typeinfo>
#include <unordered_map>

#include "cohort/compat/optimizer.h"
#include "cohort/errors.h"

namespace cohort::checkpoint {

// Note [Checkpoints hold whole tensors]
// A checkpoint of a model split over TP groups stores each split parameter whole, as
// one process would hold it, and the optimizer's state of it whole too. So model.pt
// is already the consolidated state dict Python loads, `cohort checkpoint
// consolidate` needs nothing new, and a run at any TP size loads it by keeping its
// own chunk: the layers split into equal chunks in TP-rank order, so chunk r of T is
// all a rank needs to know. The alternative, one file per TP rank, saves the gather
// but ties a checkpoint to its TP size, and every reader (Python included) would
// have to know how each layer splits. The cost is the gather at save: for the moment
// of the save, each rank of global rank 0's TP group holds the whole model and its
// optimizer state (an all-gather gives every member every chunk), and rank 0 writes
// them. DP replicas hold the same numbers, so the other TP groups gather nothing,
// and a checkpoint does not depend on the DP size either. The checkpointer's group
// must hold whole TP groups (the world does), since they gather inside it.
//
// The optimizer's state is found by type (SGD, Adam, AdamW, RMSprop, Adagrad): the
// tensors of the parameter's shape are split as it is; the rest (Adam's step) is
// the same on every rank. LibTorch loads an optimizer's state without checking
// shapes, so an unknown optimizer is refused rather than guessed at.

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// The tensors of one parameter's optimizer state, or nullopt for an optimizer whose
// state this does not know.
std::optional<std::vector<at::Tensor*>> state_tensors(torch::optim::OptimizerParamState& s) {
  using namespace torch::optim;
  if (auto* a = dynamic_cast<AdamParamState*>(&s)) return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}};
  if (auto* a = dynamic_cast<AdamWParamState*>(&s)) return {{&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()}};
  if (auto* a = dynamic_cast<SGDParamState*>(&s)) return {{&a->momentum_buffer()}};
  if (auto* a = dynamic_cast<RMSpropParamState*>(&s)) return {{&a->square_avg(), &a->momentum_buffer(), &a->grad_avg()}};
  if (auto* a = dynamic_cast<AdagradParamState*>(&s)) return {{&a->sum()}};
  return std::nullopt;
}

struct SplitParam {
  const ParameterSplit* split;
  at::Tensor param;
};

// The split parameters of `module`, by name and by tensor; a name that is not a
// parameter is a broken SplitsOf.
std::map<std::string, SplitParam> by_name(const torch::nn::Module& module, const std::vector<ParameterSplit>& splits) {
  const auto params = module.named_parameters(/*recurse=*/true);
  std::map<std::string, SplitParam> out;
  for (const auto& s : splits) {
    const auto* p = params.find(s.name);
    TORCH_INTERNAL_ASSERT(p != nullptr, "a parameter split names '", s.name, "', which the model does not have");
    TORCH_INTERNAL_ASSERT(s.group.is_member(), "the split of '", s.name, "' is over a group this rank is not in");
    out.emplace(s.name, SplitParam{&s, *p});
  }
  return out;
}

// Note [One gather per group]
// A checkpoint of a TP model gathers every split parameter and each of its
// optimizer tensors (Adam: three per parameter). One all-gather each cost a
// collective's latency per tensor, which dominated an asynchronous save's time in the
// caller (issue 49: 65 ms for the GPT of BENCHMARKS.md, where dcp.async_save took 20).
// So the slices of one group and dtype travel flattened in one buffer: every rank
// asks for the same tensors in the same order (the module's, the optimizer's), and
// each rank's slice of a tensor has the same shape, so rank r's buffer cuts at the
// same offsets as ours.
struct GatherRequest {
  at::Tensor slice;
  const comm::Group* group;
  std::int64_t dim;
};

std::vector<at::Tensor> gather_wholes(const std::vector<GatherRequest>& requests) {
  std::vector<at::Tensor> wholes(requests.size());
  std::map<std::pair<std::vector<int>, at::ScalarType>, std::vector<std::size_t>> batches;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].group->size() == 1) {
      wholes[i] = requests[i].slice;
      continue;
    }
    batches[{requests[i].group->global_ranks(), requests[i].slice.scalar_type()}].push_back(i);
  }
  for (const auto& [key, members] : batches) {
    comm::Group g = *requests[members.front()].group;  // a handle: its collectives are non-const
    std::vector<at::Tensor> flat;
    for (auto i : members) flat.push_back(requests[i].slice.detach().reshape({-1}));
    const auto parts = g.all_gather(torch::cat(flat));
    std::int64_t offset = 0;
    for (auto i : members) {
      const auto& slice = requests[i].slice;
      std::vector<at::Tensor> pieces;
      for (const auto& part : parts) pieces.push_back(part.narrow(0, offset, slice.numel()).view(slice.sizes()));
      wholes[i] = torch::cat(pieces, requests[i].dim);
      offset += slice.numel();
    }
  }
  return wholes;
}

// This rank's chunk of `whole`, which must cut into chunks shaped as `local`.
at::Tensor chunk_of(const at::Tensor& whole, const at::Tensor& local, const ParameterSplit& s, const std::string& source,
                    const std::string& what) {
  const auto parts = s.group.size();
  const auto dim = s.dim;
  if (whole.dim() != local.dim() || dim >= whole.dim())
    throw ConfigError(fmt::format("{}: {} is {}, but the model's slice is {}; it was saved from another model (check "
                                  "the architecture's flags)",
                                  source, what, shape_of(whole), shape_of(local)));
  if (whole.size(dim) % parts != 0)
    throw ConfigError(fmt::format("{}: {} is {} whole, whose dimension {} ({}) the {} ranks of TP group '{}' cannot "
                                  "split evenly; load it at a TP size that divides {}",
                                  source, what, shape_of(whole), dim, whole.size(dim), parts, s.group.name(),
                                  whole.size(dim)));
  auto expected = whole.sizes().vec();
  expected[static_cast<std::size_t>(dim)] /= parts;
  if (local.sizes().vec() != expected)
    throw ConfigError(fmt::format("{}: {} is {} whole, which the {} ranks of TP group '{}' cut into {} along "
                                  "dimension {}, but the model's slice is {}; it was saved from another model (check "
                                  "the architecture's flags), or saved as one rank's slices without "
                                  "CheckpointerOptions::split_parameters",
                                  source, what, shape_of(whole), parts, s.group.name(),
                                  shape_of(whole.narrow(dim, 0, expected[static_cast<std::size_t>(dim)])), dim,
                                  shape_of(local)));
  const auto n = expected[static_cast<std::size_t>(dim)];
  return whole.narrow(dim, s.group.rank() * n, n).contiguous().clone();
}

// Calls visit(split, state tensors) for each split parameter that has an optimizer
// state, in the optimizer's order (the same on every rank of a group).
template <typename Visit>
void for_each_split_state(const torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                          const std::vector<ParameterSplit>& splits, Visit visit) {
  std::unordered_map<const c10::TensorImpl*, SplitParam> split_of;
  for (const auto& [name, sp] : by_name(module, splits)) split_of.emplace(sp.param.unsafeGetTensorImpl(), sp);
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      const auto it = split_of.find(p.unsafeGetTensorImpl());
      if (it == split_of.end()) continue;
      const auto state = optimizer.state().find(compat::optimizer_state_key(p));
      if (state == optimizer.state().end()) continue;
      auto& s = *state->second;  // the map is const; the states it owns are not
      auto tensors = state_tensors(s);
      if (!tensors)
        throw ConfigError(fmt::format("cohort checkpoint of a tensor-parallel model: its optimizer keeps a {} for "
                                      "'{}', and which of its tensors split with the parameter is unknown; use SGD, "
                                      "Adam, AdamW, RMSprop or Adagrad",
                                      typeid(s).name(), it->second.split->name));
      visit(it->second, *tensors);
    }
  }
}

}  // namespace

c10::Dict<std::string, at::Tensor> whole_state_dict(const torch::nn::Module& module,
                                                    const std::vector<ParameterSplit>& splits) {
  const auto split = by_name(module, splits);
  std::vector<std::pair<std::string, at::Tensor>> entries;
  for (const auto& item : module.named_parameters()) entries.emplace_back(item.key(), item.value().detach());
  for (const auto& item : module.named_buffers()) entries.emplace_back(item.key(), item.value().detach());
  std::vector<GatherRequest> requests;  // Note [One gather per group]
  std::vector<std::size_t> gathered;    // which entry each request is
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto it = split.find(entries[i].first);
    if (it == split.end()) continue;
    requests.push_back({entries[i].second, &it->second.split->group, it->second.split->dim});
    gathered.push_back(i);
  }
  auto wholes = gather_wholes(requests);
  for (std::size_t k = 0; k < gathered.size(); ++k) entries[gathered[k]].second = std::move(wholes[k]);
  c10::Dict<std::string, at::Tensor> dict;
  // Each owns exactly its elements, as state_dict() does.
  for (const auto& [name, tensor] : entries) dict.insert(name, tensor.to(at::kCPU).contiguous().clone());
  return dict;
}

c10::impl::GenericDict slice_state_dict(const c10::impl::GenericDict& whole, const torch::nn::Module& module,
                                        const std::vector<ParameterSplit>& splits, const std::string& source) {
  auto out = whole.copy();
  for (const auto& [name, sp] : by_name(module, splits)) {
    const auto it = whole.find(name);
    // A missing key or a non-tensor is check_state_dict's to report.
    if (it == whole.end() || !it->value().isTensor()) continue;
    out.insert_or_assign(name, chunk_of(it->value().toTensor(), sp.param, *sp.split, source, "'" + name + "'"));
  }
  return out;
}

WholeOptimizerState::WholeOptimizerState(const torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                                         const std::vector<ParameterSplit>& splits) {
  std::vector<at::Tensor*> fields_to_gather;
  std::vector<GatherRequest> requests;  // Note [One gather per group]
  for_each_split_state(optimizer, module, splits, [&](const SplitParam& sp, const std::vector<at::Tensor*>& fields) {
    for (auto* field : fields) {
      if (!field->defined() || field->sizes() != sp.param.sizes()) continue;
      fields_to_gather.push_back(field);
      requests.push_back({*field, &sp.split->group, sp.split->dim});
    }
  });
  auto wholes = gather_wholes(requests);
  // Only now, after every gather succeeded, does the optimizer change.
  for (std::size_t i = 0; i < fields_to_gather.size(); ++i) {
    slices_.emplace_back(fields_to_gather[i], *fields_to_gather[i]);
    *fields_to_gather[i] = std::move(wholes[i]);
  }
}

WholeOptimizerState::~WholeOptimizerState() {
  for (auto& [field, slice] : slices_) *field = std::move(slice);
}

void slice_optimizer_state(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                           const std::vector<ParameterSplit>& splits, const std::string& source) {
  std::vector<std::pair<at::Tensor*, at::Tensor>> chunks;
  for_each_split_state(optimizer, module, splits, [&](const SplitParam& sp, const std::vector<at::Tensor*>& fields) {
    for (auto* field : fields) {
      if (!field->defined() || field->dim() == 0) continue;
      chunks.emplace_back(field, chunk_of(*field, sp.param, *sp.split, source,
                                          fmt::format("the optimizer state of '{}'", sp.split->name)));
    }
  });
  for (auto& [field, chunk] : chunks) *field = std::move(chunk);
}

}  // namespace cohort::checkpoint
