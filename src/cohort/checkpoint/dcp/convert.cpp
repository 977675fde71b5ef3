#include "cohort/checkpoint/dcp/convert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>

#include "cohort/checkpoint/consolidate_internal.h"
#include "cohort/errors.h"

namespace cohort::checkpoint::dcp {
namespace {

// Back from Note [No floats for Python 1.13]: 0-d float64 tensors are the floats.
c10::IValue as_python(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().dim() == 0 && v.toTensor().scalar_type() == at::kDouble)
    return v.toTensor().item<double>();
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : v.toTupleRef().elements()) items.push_back(as_python(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return v;
}

// PyTorch 2.11's param-group options beyond LibTorch's, at PyTorch's defaults.
std::vector<std::pair<std::string, c10::IValue>> pytorch_only_options(const std::string& kind) {
  std::vector<std::pair<std::string, c10::IValue>> extra = {{"maximize", false},
                                                           {"foreach", c10::IValue()},
                                                           {"differentiable", false},
                                                           {"fused", c10::IValue()}};
  if (kind != "sgd") {
    extra.emplace_back("capturable", false);
    extra.emplace_back("decoupled_weight_decay", kind == "adamw");
  }
  return extra;
}

std::string kind_of(const GenericDict& options, const std::string& given) {
  // The options only they have: RMSprop has momentum too, but no dampening.
  const bool adam_like = options.contains("betas") && options.contains("amsgrad");
  const bool sgd_like = options.contains("dampening") && options.contains("nesterov");
  if (!adam_like && !sgd_like)
    throw ConfigError("the checkpoint's optimizer is neither Adam(W) nor SGD (its options are not theirs); PyTorch's "
                      "distributed checkpoints are written for those three");
  if (given.empty()) {
    if (sgd_like) return "sgd";
    throw ConfigError("the checkpoint's optimizer is Adam or AdamW, whose LibTorch files look alike; say which "
                      "with --optimizer adam or --optimizer adamw");
  }
  if ((given == "sgd") != sgd_like)
    throw ConfigError(fmt::format("--optimizer {}: the checkpoint's optimizer has {}; give --optimizer {}", given,
                                  sgd_like ? "SGD's options" : "Adam's options", sgd_like ? "sgd" : "adam or adamw"));
  return given;
}

}  // namespace

std::vector<Entry> entries_of_state(const GenericDict& state, const std::string& optimizer, const std::string& source,
                                    std::string& chosen) {
  std::vector<Entry> entries;
  std::vector<std::string> names;  // the model's entries in order: parameter i is names[i]
  for (const auto& item : state.at("model").toGenericDict()) {
    names.push_back(item.key().toStringRef());
    entries.push_back({"model." + names.back(), {"model", names.back()}, item.value()});
  }
  const auto optim = state.at("optimizer").toGenericDict();
  const auto groups = optim.at("param_groups").toList();
  std::int64_t g = 0;
  for (const auto& group_value : groups) {
    const auto group = group_value.get().toGenericDict();
    if (g == 0) chosen = kind_of(group, optimizer);
    const std::string prefix = fmt::format("optim.param_groups.{}.", g);
    std::vector<std::string> params;
    for (const auto& item : group) {
      const std::string option = item.key().toStringRef();
      if (option == "params") {
        for (const auto& index : item.value().toList()) {
          const auto i = index.get().toInt();
          if (i < 0 || i >= static_cast<std::int64_t>(names.size()))
            throw DataError(fmt::format("{}: the optimizer's parameter {} is not among the model's {} entries", source,
                                        i, names.size()));
          params.push_back(names[static_cast<std::size_t>(i)]);
        }
        continue;
      }
      entries.push_back({prefix + option, {"optim", "param_groups", g, option}, as_python(item.value())});
    }
    for (const auto& [option, value] : pytorch_only_options(chosen))
      if (!group.contains(option)) entries.push_back({prefix + option, {"optim", "param_groups", g, option}, value});
    entries.push_back({prefix + "params", {"optim", "param_groups", g, "params"}, c10::List<std::string>(params)});
    ++g;
  }
  // Sorted by parameter, as PyTorch's state_dict lists them.
  std::map<std::int64_t, GenericDict> by_index;
  for (const auto& item : optim.at("state").toGenericDict()) by_index.emplace(item.key().toInt(), item.value().toGenericDict());
  for (const auto& [index, fields] : by_index) {
    if (index < 0 || index >= static_cast<std::int64_t>(names.size()))
      throw DataError(fmt::format("{}: the optimizer has a state for parameter {}, and the model {} entries", source,
                                  index, names.size()));
    const std::string& name = names[static_cast<std::size_t>(index)];
    for (const auto& field : fields) {
      const std::string key = field.key().toStringRef();
      c10::IValue value = field.value();
      // PyTorch's Adam keeps its step count as a 0-d float32 tensor.
      if (key == "step" && value.isInt()) value = at::scalar_tensor(static_cast<double>(value.toInt()), at::kFloat);
      entries.push_back({fmt::format("optim.state.{}.{}", name, key), {"optim", "state", name, key}, value});
    }
  }
  entries.push_back({"train.step", {"train", "step"}, state.at("step")});
  entries.push_back({"train.epoch", {"train", "epoch"}, state.at("epoch")});
  return entries;
}

Converted convert_to_dcp(const std::string& source, const std::string& out, const std::string& optimizer,
                         std::ostream& log) {
  if (!optimizer.empty() && optimizer != "adam" && optimizer != "adamw" && optimizer != "sgd")
    throw ConfigError(fmt::format("--optimizer {}: give adam, adamw or sgd", optimizer));
  Converted converted;
  const auto state = consolidated_state(source, log, converted.source);
  converted.written =
      write_checkpoint(out, entries_of_state(state, optimizer, converted.source.checkpoint, converted.optimizer));
  return converted;
}

}  // namespace cohort::checkpoint::dcp
