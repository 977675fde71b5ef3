// Started by tests/multiproc/tensor_parallel_checkpoint_test.cpp through `cohort run`:
// checkpoints of a tensor-parallel model in real processes (Note [Checkpoints hold
// whole tensors]). A tiny language model (vocabulary-parallel tied embedding, one
// ParallelTransformerBlock, a LayerNorm; double precision, no dropout) trains on
// fixed batches, each split over the DP replicas, whose gradients are averaged.
//
//   tp_checkpoint_worker save DIR TP     3 steps, checkpoint (step 3), 2 more; rank 0
//                                        writes the whole weights to DIR/uninterrupted.pt
//   tp_checkpoint_worker resume DIR TP   loads the checkpoint at this world size and
//                                        TP, 2 steps; prints "tp-checkpoint resume ok
//                                        ..." when the whole weights equal
//                                        uninterrupted.pt within 1e-9, exits 1 otherwise
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <iostream>
#include <string>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/comm/device_mesh.h"
#include "cohort/comm/world.h"
#include "cohort/tensor_parallel/block.h"
#include "cohort/tensor_parallel/checkpoint.h"
#include "cohort/tensor_parallel/cross_entropy.h"
#include "cohort/tensor_parallel/embedding.h"

namespace {

using namespace cohort::tensor_parallel;
namespace ckpt = cohort::checkpoint;
constexpr std::int64_t kVocab = 16, kHidden = 8, kBatch = 4, kSequence = 6;
constexpr int kSaveStep = 3, kLastStep = 5;

struct LmImpl : torch::nn::Module {
  VocabParallelEmbedding embed{nullptr};
  ParallelTransformerBlock block{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  explicit LmImpl(const cohort::comm::Group& tp) {
    embed = register_module("embed", VocabParallelEmbedding(tp, VocabParallelEmbeddingOptions(kVocab, kHidden)));
    block = register_module("block", ParallelTransformerBlock(tp, ParallelTransformerBlockOptions(kHidden, 2)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    to(torch::kDouble);
  }
};
TORCH_MODULE(Lm);

// Step `step`'s batch, the same in every process; this DP rank's rows of it.
torch::Tensor rows_of(int step, const cohort::comm::Group& dp) {
  auto ids = torch::randint(kVocab, {kBatch, kSequence}, at::detail::createCPUGenerator(50 + step));
  return ids.chunk(dp.size(), 0)[static_cast<std::size_t>(dp.rank())];
}

void train(Lm& lm, torch::optim::Optimizer& opt, cohort::comm::Group& tp, cohort::comm::Group& dp, int from, int to) {
  for (int step = from; step < to; ++step) {
    const auto ids = rows_of(step, dp);
    opt.zero_grad();
    auto logits = lm->embed->logits(lm->norm(lm->block(lm->embed(ids))));
    vocab_parallel_cross_entropy(logits, ids.roll(1, 1), tp).backward();
    // Equal shares of the batch: the mean of the replicas' mean losses is the batch's.
    if (dp.size() > 1)
      for (auto& p : lm->parameters()) {
        dp.all_reduce(p.mutable_grad());
        p.mutable_grad().div_(dp.size());
      }
    opt.step();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: tp_checkpoint_worker save|resume DIR TP\n";
    return 2;
  }
  const std::string phase = argv[1], dir = argv[2];
  const int tp_size = std::stoi(argv[3]);
  torch::set_num_threads(1);
  auto world = cohort::comm::World::init();
  cohort::comm::DeviceMesh mesh(world, cohort::comm::MeshShape().tensor(tp_size));
  auto& tp = mesh.group(cohort::comm::MeshDim::kTensor);
  auto& dp = mesh.group(cohort::comm::MeshDim::kData);
  torch::manual_seed(phase == "save" ? 3 : 99);  // a resumed run's own weights are replaced
  Lm lm(tp);
  torch::optim::Adam opt(lm->parameters(), torch::optim::AdamOptions(1e-2));
  ckpt::Checkpointer checkpointer(dir, world.group(), ckpt::CheckpointerOptions().split_parameters(parameter_splits));
  const std::string reference = dir + "/uninterrupted.pt";

  if (phase == "save") {
    train(lm, opt, tp, dp, 0, kSaveStep);
    checkpointer.save(*lm, opt, {kSaveStep, 0, kSaveStep, std::nullopt}, torch::kCPU);
    train(lm, opt, tp, dp, kSaveStep, kLastStep);
    const auto whole = ckpt::whole_state_dict(*lm, parameter_splits(*lm));
    if (world.rank() == 0) ckpt::write_file_atomically(reference, ckpt::torch_save_bytes(whole));
    std::cout << "tp-checkpoint save ok rank " << world.rank() << std::endl;
    return 0;
  }
  const auto restored = checkpointer.load_latest(*lm, opt, torch::kCPU);
  if (!restored || restored->progress.step != kSaveStep) {
    std::cerr << "rank " << world.rank() << ": no checkpoint of step " << kSaveStep << " in " << dir << "\n";
    return 1;
  }
  train(lm, opt, tp, dp, kSaveStep, kLastStep);
  const auto whole = ckpt::whole_state_dict(*lm, parameter_splits(*lm));
  const auto saved = ckpt::torch_load_bytes(ckpt::read_whole_file(reference), reference).toGenericDict();
  double worst = 0;
  for (const auto& item : whole) {
    const auto other = saved.at(item.key()).toTensor();
    if (other.sizes() != item.value().sizes()) {
      std::cerr << item.key() << " is " << item.value().sizes() << " here and " << other.sizes() << " in "
                << reference << "\n";
      return 1;
    }
    worst = std::max(worst, (other - item.value()).abs().max().item<double>());
  }
  const bool ok = worst < 1e-9 && saved.size() == whole.size();
  std::cout << "tp-checkpoint resume " << (ok ? "ok" : "FAILED") << " rank " << world.rank() << " world "
            << world.size() << " dp " << dp.size() << " tp " << tp.size() << " max_weight_diff " << worst << std::endl;
  return ok ? 0 : 1;
}
