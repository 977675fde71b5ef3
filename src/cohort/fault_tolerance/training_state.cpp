#include "cohort/fault_tolerance/training_state.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <fmt/format.h>

#include <functional>

#include "cohort/checkpoint/rng_state.h"
#include "cohort/errors.h"
#include "cohort/fault_tolerance/replica_sharded_optimizer.h"

namespace cohort::fault_tolerance {

namespace {

c10::Device device_of(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.device();
  return c10::kCPU;
}

}  // namespace

namespace {

void save_with(std::ostream& out, const torch::nn::Module& module,
               const std::function<void(torch::serialize::OutputArchive&)>& optimizer) {
  torch::serialize::OutputArchive archive;
  for (const auto& p : module.named_parameters()) archive.write("parameter/" + p.key(), p.value());
  for (const auto& b : module.named_buffers()) archive.write("buffer/" + b.key(), b.value(), /*is_buffer=*/true);
  if (optimizer) {
    torch::serialize::OutputArchive opt;
    optimizer(opt);
    archive.write("optimizer", opt);
  }
  const auto rng = checkpoint::capture_rng_state(device_of(module));
  archive.write("rng_count", torch::tensor(static_cast<std::int64_t>(rng.size())));
  for (size_t i = 0; i < rng.size(); ++i) archive.write("rng_" + std::to_string(i), rng[i]);
  archive.save_to(out);
}

}  // namespace

void save_training_state(std::ostream& out, const torch::nn::Module& module, const torch::optim::Optimizer* optimizer) {
  if (!optimizer) return save_with(out, module, nullptr);
  save_with(out, module, [&](torch::serialize::OutputArchive& a) { optimizer->save(a); });
}

void save_training_state(std::ostream& out, const torch::nn::Module& module, const ReplicaShardedOptimizer& optimizer) {
  save_with(out, module, [&](torch::serialize::OutputArchive& a) { optimizer.save_state(a); });
}

namespace {

// Module::load would take a tensor of any shape; a joiner must refuse one.
void copy_checked(torch::serialize::InputArchive& archive, const std::string& key, at::Tensor& into) {
  at::Tensor read;
  archive.read(key, read);
  if (read.sizes() != into.sizes() || read.scalar_type() != into.scalar_type())
    throw DataError(fmt::format("cohort: fault tolerance: the training state received from a live replica holds {} "
                                "as {} {}, but this replica's model has {} {}\n  fix: every replica must run the same "
                                "program with the same model",
                                key, c10::toString(read.scalar_type()), c10::str(read.sizes()), c10::toString(into.scalar_type()),
                                c10::str(into.sizes())));
  torch::NoGradGuard no_grad;
  into.copy_(read);
}

void load_with(std::istream& in, torch::nn::Module& module,
               const std::function<void(torch::serialize::InputArchive&)>& optimizer) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(in, device_of(module));
    for (auto& p : module.named_parameters()) copy_checked(archive, "parameter/" + p.key(), p.value());
    for (auto& b : module.named_buffers()) copy_checked(archive, "buffer/" + b.key(), b.value());
    if (optimizer) {
      torch::serialize::InputArchive opt;
      archive.read("optimizer", opt);
      optimizer(opt);
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

}  // namespace

void load_training_state(std::istream& in, torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  if (!optimizer) return load_with(in, module, nullptr);
  load_with(in, module, [&](torch::serialize::InputArchive& a) { optimizer->load(a); });
}

void load_training_state(std::istream& in, torch::nn::Module& module, ReplicaShardedOptimizer& optimizer) {
  load_with(in, module, [&](torch::serialize::InputArchive& a) { optimizer.load_state(a); });
}

}  // namespace cohort::fault_tolerance
