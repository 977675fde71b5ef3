#include "cohort/checkpoint/dcp/to_cohort.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <sstream>

#include "cohort/compat/optimizer.h"
#include "cohort/errors.h"

namespace cohort::checkpoint::dcp {
namespace {

using Path = std::vector<std::variant<std::string, std::int64_t>>;

// Note [Keys without their paths]: planner_data gives each key's path in the nested
// state dict, but it is optional; without it a key is split where its prefix says
// (a parameter's name has dots, so the field is what follows the last one).
Path path_from_key(const std::string& key) {
  auto starts = [&](const std::string& prefix) { return key.rfind(prefix, 0) == 0; };
  if (starts("model.")) return {"model", key.substr(6)};
  if (starts("optim.state.")) {
    const auto rest = key.substr(12);
    const auto dot = rest.rfind('.');
    if (dot != std::string::npos) return {"optim", "state", rest.substr(0, dot), rest.substr(dot + 1)};
  }
  if (starts("optim.param_groups.")) {
    const auto rest = key.substr(19);
    const auto dot = rest.find('.');
    if (dot != std::string::npos && dot > 0 && rest.find_first_not_of("0123456789") == dot)
      return {"optim", "param_groups", std::stoll(rest.substr(0, dot)), rest.substr(dot + 1)};
  }
  if (starts("train.")) return {"train", key.substr(6)};
  return {key};
}

const std::string* text(const Path& p, std::size_t i) {
  return i < p.size() ? std::get_if<std::string>(&p[i]) : nullptr;
}

double number(const c10::IValue& v, const std::string& what, const std::string& source) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1 : 0;
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  throw DataError(fmt::format("{}: {} is {}, not a number", source, what, v.tagKind()));
}

struct Group {
  std::map<std::string, c10::IValue> options;
  std::vector<std::string> params;
};

// Adam's and AdamW's options and state are alike field for field.
template <typename Options>
std::unique_ptr<torch::optim::OptimizerOptions> adam_options(const Group& g, const std::string& source) {
  auto o = std::make_unique<Options>();
  auto opt = [&](const char* name) -> const c10::IValue* {
    const auto it = g.options.find(name);
    return it == g.options.end() ? nullptr : &it->second;
  };
  if (auto* v = opt("lr")) o->lr(number(*v, "lr", source));
  if (auto* v = opt("eps")) o->eps(number(*v, "eps", source));
  if (auto* v = opt("weight_decay")) o->weight_decay(number(*v, "weight_decay", source));
  if (auto* v = opt("amsgrad")) o->amsgrad(number(*v, "amsgrad", source) != 0);
  if (auto* v = opt("betas")) {
    if (!v->isTuple() || v->toTupleRef().elements().size() != 2)
      throw DataError(fmt::format("{}: betas is not a pair", source));
    o->betas({number(v->toTupleRef().elements()[0], "betas", source),
              number(v->toTupleRef().elements()[1], "betas", source)});
  }
  return o;
}

std::unique_ptr<torch::optim::OptimizerOptions> sgd_options(const Group& g, const std::string& source) {
  double lr = 0.01;  // PyTorch's SGD has a default learning rate since 2.2; LibTorch's wants one
  if (auto it = g.options.find("lr"); it != g.options.end()) lr = number(it->second, "lr", source);
  auto o = std::make_unique<torch::optim::SGDOptions>(lr);
  for (const auto& [name, v] : g.options) {
    if (name == "momentum") o->momentum(number(v, name, source));
    if (name == "dampening") o->dampening(number(v, name, source));
    if (name == "weight_decay") o->weight_decay(number(v, name, source));
    if (name == "nesterov") o->nesterov(number(v, name, source) != 0);
  }
  return o;
}

std::string kind_of(const std::vector<Group>& groups, const std::string& source) {
  // Told apart by the options only they have: NAdam, RAdam and Adamax have betas but
  // no amsgrad, RMSprop has momentum but no dampening.
  const auto& o = groups.front().options;
  if (o.count("betas") != 0 && o.count("amsgrad") != 0) {
    const auto it = o.find("decoupled_weight_decay");
    return it != o.end() && it->second.isBool() && it->second.toBool() ? "adamw" : "adam";
  }
  if (o.count("dampening") != 0 && o.count("nesterov") != 0) return "sgd";
  std::string names;
  for (const auto& [name, v] : o) names += (names.empty() ? "" : ", ") + name;
  throw ConfigError(fmt::format("{}: its optimizer (options {}) is neither Adam, AdamW nor SGD, the ones cohort "
                                "reads from a distributed checkpoint; load the model alone by saving it without "
                                "its optimizer",
                                source, names));
}

at::Tensor field_tensor(const std::map<std::string, c10::IValue>& fields, const char* name, const at::Tensor& param,
                        const std::string& who, const std::string& source) {
  const auto it = fields.find(name);
  if (it == fields.end() || it->second.isNone()) return {};  // SGD without momentum keeps None
  if (!it->second.isTensor() || it->second.toTensor().sizes() != param.sizes())
    throw DataError(fmt::format("{}: the optimizer's {} of '{}' is not a tensor of its parameter's shape", source, name,
                                who));
  return it->second.toTensor();
}

// The optimizer's state as LibTorch serialises it: an optimizer of that kind over
// stand-ins for the parameters, its state set, saved (the archive keys parameters by
// position, which is how a cohort optimizer loads it).
std::string optimizer_archive(const std::string& kind, const std::vector<Group>& groups,
                              const std::map<std::string, std::map<std::string, c10::IValue>>& state,
                              const c10::impl::GenericDict& model, const std::string& source,
                              std::int64_t& with_state) {
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& g : groups) {
    std::vector<at::Tensor> tensors;
    for (const auto& name : g.params) {
      if (!model.contains(name))
        throw DataError(fmt::format("{}: the optimizer's parameter '{}' is not among the model's {} entries", source,
                                    name, model.size()));
      tensors.push_back(at::zeros_like(model.at(name).toTensor()));
      params.emplace_back(name, tensors.back());
    }
    std::unique_ptr<torch::optim::OptimizerOptions> options =
        kind == "sgd"     ? sgd_options(g, source)
        : kind == "adamw" ? adam_options<torch::optim::AdamWOptions>(g, source)
                          : adam_options<torch::optim::AdamOptions>(g, source);
    param_groups.emplace_back(std::move(tensors), std::move(options));
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (kind == "sgd") optimizer = std::make_unique<torch::optim::SGD>(param_groups, torch::optim::SGDOptions(0.01));
  else if (kind == "adamw") optimizer = std::make_unique<torch::optim::AdamW>(param_groups);
  else optimizer = std::make_unique<torch::optim::Adam>(param_groups);

  for (const auto& named : params) {
    // Named, not a structured binding: C++17 lambdas cannot capture those (clang refuses).
    const std::string& name = named.first;
    const at::Tensor& param = named.second;
    const auto it = state.find(name);
    if (it == state.end()) continue;
    const auto& fields = it->second;
    std::unique_ptr<torch::optim::OptimizerParamState> s;
    if (kind == "sgd") {
      auto sgd = std::make_unique<torch::optim::SGDParamState>();
      if (auto m = field_tensor(fields, "momentum_buffer", param, name, source); m.defined()) sgd->momentum_buffer(m);
      else continue;  // PyTorch keeps momentum_buffer None without momentum: no state
      s = std::move(sgd);
    } else {
      auto fill = [&](auto adam) {
        const auto step = fields.find("step");
        if (step == fields.end()) throw DataError(fmt::format("{}: the Adam state of '{}' has no step", source, name));
        adam->step(static_cast<std::int64_t>(number(step->second, "step of '" + name + "'", source)));
        auto exp_avg = field_tensor(fields, "exp_avg", param, name, source);
        auto exp_avg_sq = field_tensor(fields, "exp_avg_sq", param, name, source);
        if (!exp_avg.defined() || !exp_avg_sq.defined())
          throw DataError(fmt::format("{}: the Adam state of '{}' lacks exp_avg or exp_avg_sq", source, name));
        adam->exp_avg(exp_avg);
        adam->exp_avg_sq(exp_avg_sq);
        if (auto m = field_tensor(fields, "max_exp_avg_sq", param, name, source); m.defined()) adam->max_exp_avg_sq(m);
        return adam;
      };
      if (kind == "adamw") s = fill(std::make_unique<torch::optim::AdamWParamState>());
      else s = fill(std::make_unique<torch::optim::AdamParamState>());
    }
    optimizer->state()[compat::optimizer_state_key(param)] = std::move(s);
    ++with_state;
  }
  torch::serialize::OutputArchive archive;
  optimizer->save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

CohortState to_cohort(const std::vector<Entry>& entries, const std::string& source) {
  CohortState out;
  std::map<std::int64_t, Group> groups;
  std::map<std::string, std::map<std::string, c10::IValue>> state;
  for (const auto& e : entries) {
    const Path path = e.path.size() == 1 ? path_from_key(e.key) : e.path;
    const std::string* top = text(path, 0);
    if (top != nullptr && *top == "model" && path.size() == 2 && text(path, 1) != nullptr && e.value.isTensor()) {
      out.model.insert(*text(path, 1), e.value.toTensor());
    } else if (top != nullptr && *top == "optim" && path.size() == 4 && text(path, 1) != nullptr &&
               *text(path, 1) == "state" && text(path, 2) != nullptr && text(path, 3) != nullptr) {
      state[*text(path, 2)][*text(path, 3)] = e.value;
    } else if (top != nullptr && *top == "optim" && path.size() == 4 && text(path, 1) != nullptr &&
               *text(path, 1) == "param_groups" && std::holds_alternative<std::int64_t>(path[2]) &&
               text(path, 3) != nullptr) {
      Group& g = groups[std::get<std::int64_t>(path[2])];
      if (*text(path, 3) != "params") {
        g.options[*text(path, 3)] = e.value;
        continue;
      }
      if (!e.value.isList()) throw DataError(fmt::format("{}: '{}' is not a list", source, e.key));
      for (const auto& p : e.value.toListRef()) {
        if (!p.isString())
          throw ConfigError(fmt::format("{}: '{}' lists parameter numbers, as optimizer.state_dict() gives them; "
                                        "cohort reads the named form: save {{\"optim\": ...}} from "
                                        "torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)",
                                        source, e.key));
        g.params.push_back(p.toStringRef());
      }
    } else if (const std::string* last = text(path, path.size() - 1);
               top != nullptr && last != nullptr && (path.size() == 1 || (path.size() == 2 && *top == "train")) &&
               (*last == "step" || *last == "epoch")) {
      (*last == "step" ? out.step : out.epoch) = static_cast<std::int64_t>(number(e.value, e.key, source));
    } else {
      out.ignored.push_back(e.key);
    }
  }
  if (groups.empty()) {
    for (const auto& [name, fields] : state) out.ignored.push_back("optim.state." + name);
    return out;
  }
  std::vector<Group> ordered;
  for (auto& [g, group] : groups) {
    if (g != static_cast<std::int64_t>(ordered.size()))
      throw DataError(fmt::format("{}: its optimizer has parameter group {} but not group {}", source, g,
                                  ordered.size()));
    ordered.push_back(std::move(group));
  }
  out.optimizer = kind_of(ordered, source);
  out.optimizer_bytes =
      optimizer_archive(out.optimizer, ordered, state, out.model, source, out.parameters_with_state);
  return out;
}

}  // namespace cohort::checkpoint::dcp
