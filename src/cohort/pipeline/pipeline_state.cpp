// Pipeline::full_state_dict(): the whole model's state dict, each stage's sent to
// pipeline rank 0 (Note [Assembling the state dict]).
#include "cohort/pipeline/pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "cohort/checkpoint/state_dict.h"
#include "cohort/errors.h"
#include "cohort/pipeline/wire.h"

namespace cohort::pipeline {

namespace {

// Note [Assembling the state dict]
// A stage may have more entries than one transfer carries (wire.h's limits on
// tensors and header slots), so each stage's state dict travels as a series of
// transfers to pipeline rank 0: first its names ('\n'-separated bytes) with the
// number of transfers that follow, then its tensors in groups that fit. The
// transfers are numbered in the micro-batch field of the tag under a stage number
// no step uses; rank 0 receives them in the order they were sent.
constexpr int kStateTag = 0xFF;

std::vector<TensorList> fitting_groups(const TensorList& tensors) {
  std::vector<TensorList> groups(1);
  std::int64_t slots = 1;  // the header's count
  for (const auto& t : tensors) {
    const std::int64_t need = 2 + t.dim();
    if (static_cast<int>(groups.back().size()) == kMaxWireTensors || slots + need > kHeaderSlots) {
      groups.emplace_back();
      slots = 1;
    }
    groups.back().push_back(t);
    slots += need;
  }
  return groups;
}

c10::Dict<std::string, at::Tensor> entries_of(const PipelineStage& stage) {
  torch::nn::Module holder;
  for (const auto& [name, child] : stage.state_children()) holder.register_module(name, child);
  return checkpoint::state_dict(holder);
}

}  // namespace

c10::Dict<std::string, at::Tensor> Pipeline::full_state_dict() {
  std::map<int, c10::Dict<std::string, at::Tensor>> by_stage;
  int sequence = 0;  // transfers between this rank and rank 0, in order
  if (rank_ != 0) {
    std::vector<Sent> sends;
    for (const auto& stage : stages_) {
      auto dict = entries_of(stage);
      std::string names;  // never empty: some transports refuse a message of no bytes
      TensorList tensors;
      for (const auto& item : dict) {
        names += item.key() + "\n";
        tensors.push_back(item.value().to(options_.device()));
      }
      if (names.empty()) names = "\n";
      auto groups = fitting_groups(tensors);
      auto name_bytes = at::empty({static_cast<std::int64_t>(names.size())}, at::TensorOptions().dtype(at::kByte));
      std::memcpy(name_bytes.data_ptr(), names.data(), names.size());
      auto count = at::tensor(std::vector<std::int64_t>{static_cast<std::int64_t>(groups.size())},
                              at::TensorOptions().dtype(at::kLong));
      sends.push_back(send_tensors(group_, {name_bytes.to(options_.device()), count.to(options_.device())}, 0,
                                   Direction::kActivation, kStateTag, sequence++, options_.device()));
      for (const auto& g : groups)
        sends.push_back(
            send_tensors(group_, g, 0, Direction::kActivation, kStateTag, sequence++, options_.device()));
    }
    for (auto& sent : sends)
      for (auto& p : sent.pending) p.wait();
    return c10::Dict<std::string, at::Tensor>();
  }
  for (const auto& stage : stages_) by_stage[stage.index()] = entries_of(stage);
  for (int r = 1; r < group_.size(); ++r) {
    sequence = 0;
    for (int c = 0; c < schedule_.virtual_stages; ++c) {
      auto head = recv_tensors(group_, r, Direction::kActivation, kStateTag, sequence++, options_.device());
      auto bytes = head.at(0).cpu();
      std::string names(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
      const auto groups = head.at(1).cpu().item<std::int64_t>();
      c10::Dict<std::string, at::Tensor> dict;
      std::size_t start = 0;
      for (std::int64_t g = 0; g < groups; ++g)
        for (const auto& t : recv_tensors(group_, r, Direction::kActivation, kStateTag, sequence++, options_.device())) {
          auto end = names.find('\n', start);
          dict.insert(names.substr(start, end - start), t.cpu());
          start = end + 1;
        }
      by_stage[r + c * group_.size()] = dict;
    }
  }
  c10::Dict<std::string, at::Tensor> whole;
  for (const auto& [stage, dict] : by_stage)
    for (const auto& item : dict) {
      if (whole.contains(item.key()))
        throw ConfigError(fmt::format("cohort pipeline: '{}' appears in two stages; give hand-written stages distinct "
                                      "state prefixes",
                                      item.key()));
      whole.insert(item.key(), item.value());
    }
  return whole;
}

}  // namespace cohort::pipeline
