#include "comm_hook.h"

#include <iostream>

#include "cohort/ddp/powersgd_hook.h"

namespace fashion_mnist {
namespace {

constexpr char kStateKey[] = "powersgd";

}  // namespace

CommHookChoice::CommHookChoice(const TrainerOptions& o) : name_(o.comm_hook) {
  if (o.comm_hook == "fp16") hook_ = cohort::ddp::fp16_compress_hook();
  if (o.comm_hook == "bf16") hook_ = cohort::ddp::bf16_compress_hook();
  if (o.comm_hook == "powersgd")
    hook_ = cohort::ddp::powersgd_hook(cohort::ddp::PowerSGDOptions()
                                           .matrix_approximation_rank(o.powersgd_rank)
                                           .start_powerSGD_iter(o.powersgd_start));
}

void CommHookChoice::save(cohort::checkpoint::TrainingProgress& progress, cohort::comm::Group& group) const {
  auto* powersgd = dynamic_cast<cohort::ddp::PowerSGDHook*>(hook_.get());
  if (powersgd == nullptr) return;
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& [key, tensor] : powersgd->state_dict(group)) state.insert(key, tensor);
  progress.extra[kStateKey] = state;
}

void CommHookChoice::restore(const cohort::checkpoint::TrainingProgress& progress, cohort::comm::Group& group) const {
  auto* powersgd = dynamic_cast<cohort::ddp::PowerSGDHook*>(hook_.get());
  auto it = progress.extra.find(kStateKey);
  if (powersgd == nullptr || it == progress.extra.end()) return;
  std::map<std::string, at::Tensor> state;
  for (const auto& entry : it->second.toGenericDict()) state[entry.key().toStringRef()] = entry.value().toTensor();
  if (!powersgd->load_state_dict(state, group) && group.rank() == 0)
    std::cout << "note: PowerSGD's error memories were saved at another world size; they restart at zero"
              << std::endl;
}

nlohmann::json CommHookChoice::summary() const {
  nlohmann::json out = {{"comm_hook", name_}};
  if (auto* powersgd = dynamic_cast<cohort::ddp::PowerSGDHook*>(hook_.get())) {
    const auto& t = powersgd->last_step_traffic();
    out["powersgd"] = {{"rank", powersgd->options().matrix_approximation_rank()},
                       {"start_iteration", powersgd->options().start_powerSGD_iter()},
                       {"elements_sent_last_step", t.compressed + t.uncompressed},
                       {"elements_of_plain_all_reduce", t.dense}};
  }
  return out;
}

}  // namespace fashion_mnist
