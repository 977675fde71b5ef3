#include "cohort/fault_tolerance/training_state.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <fmt/format.h>

#include "cohort/checkpoint/rng_state.h"
#include "cohort/errors.h"

namespace cohort::fault_tolerance {

namespace {

c10::Device device_of(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.device();
  return c10::kCPU;
}

}  // namespace

void save_training_state(std::ostream& out, const torch::nn::Module& module, const torch::optim::Optimizer* optimizer) {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model;
  module.save(model);
  archive.write("model", model);
  if (optimizer) {
    torch::serialize::OutputArchive opt;
    optimizer->save(opt);
    archive.write("optimizer", opt);
  }
  const auto rng = checkpoint::capture_rng_state(device_of(module));
  archive.write("rng_count", torch::tensor(static_cast<std::int64_t>(rng.size())));
  for (size_t i = 0; i < rng.size(); ++i) archive.write("rng_" + std::to_string(i), rng[i]);
  archive.save_to(out);
}

void load_training_state(std::istream& in, torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(in, device_of(module));
    torch::serialize::InputArchive model;
    archive.read("model", model);
    module.load(model);
    if (optimizer) {
      torch::serialize::InputArchive opt;
      archive.read("optimizer", opt);
      optimizer->load(opt);
    }
    at::Tensor count;
    archive.read("rng_count", count);
    std::vector<at::Tensor> rng(static_cast<size_t>(count.item<std::int64_t>()));
    for (size_t i = 0; i < rng.size(); ++i) archive.read("rng_" + std::to_string(i), rng[i]);
    checkpoint::restore_rng_state(device_of(module), rng);
  } catch (const c10::Error& e) {
    throw DataError(fmt::format("cohort: fault tolerance: the training state received from a live replica does not "
                                "fit this model or optimizer: {}\n  fix: every replica must run the same program "
                                "with the same model and optimizer",
                                e.what_without_backtrace()));
  }
}

}  // namespace cohort::fault_tolerance
