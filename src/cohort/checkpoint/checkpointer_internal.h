#pragma once
// The collective helpers that Checkpointer's save and load share. Internal: not
// installed, included by checkpointer*.cpp only.
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/manifest.h"
#include "cohort/checkpoint/trainer_state.h"
#include "cohort/comm/group.h"

namespace cohort::checkpoint {

// One code per rank, combined so that every rank learns the largest.
inline std::int64_t max_over_ranks(comm::Group& group, std::int64_t code, c10::Device device) {
  auto flag = torch::full({1}, code, torch::dtype(torch::kInt64).device(device));
  group.all_reduce(flag, comm::ReduceOp::kMax);
  return flag.item<std::int64_t>();
}

// One flag per rank, combined so that every rank learns whether any rank failed.
inline bool any_rank(comm::Group& group, bool failed, c10::Device device) {
  return max_over_ranks(group, failed ? 1 : 0, device) != 0;
}

// LibTorch's serialized optimizer state (optimizer.pt).
std::string optimizer_bytes(const torch::optim::Optimizer& optimizer);

// Note [Checkpoints in PyTorch's format] (checkpointer_dcp.cpp).
// The files of a whole checkpoint in `format`, in the order save_whole makes them.
const std::vector<std::string>& whole_files(Format format);
// The PyTorch optimizer a Format::kDcp checkpoint is written for: `given`, or from the
// optimizer's type (adam, adamw, sgd), or "" (decided from its options).
std::string dcp_kind_of(const torch::optim::Optimizer& optimizer, const std::string& given);
// whole_files(Format::kDcp)'s contents, from the model.pt and optimizer.pt bytes.
std::vector<std::string> as_dcp_contents(const std::string& model, const std::string& optimizer,
                                         const std::string& trainer, std::int64_t step, std::int64_t epoch,
                                         const std::string& kind, const std::string& path);

// A step-N directory that PyTorch's dcp.save wrote: a .metadata and no manifest.
bool is_foreign_dcp(const std::string& path);
// Throws cohort::DataError when its metadata is unreadable or a data file is short.
void verify_foreign_dcp(const std::string& path);

// What load_latest reads of a checkpoint in PyTorch's format: the bytes a whole
// checkpoint's model.pt and optimizer.pt would hold (the optimizer's empty when the
// checkpoint has none), and the trainer state (its step alone for PyTorch's own).
struct DcpLoad {
  std::string model, optimizer;
  TrainerState trainer;
  bool has_trainer = false;
  std::vector<std::string> ignored;  // keys cohort does not use
};
// `manifest`: cohort's Format::kDcp checkpoint, every file checked against it; null:
// PyTorch's own. Throws cohort::DataError or cohort::ConfigError as dcp/reader.h and
// dcp/to_cohort.h say. `step`: the directory's, or -1 for the checkpoint's own train.step.
DcpLoad read_dcp_checkpoint(const std::string& path, const Manifest* manifest, std::int64_t step);

}  // namespace cohort::checkpoint
