// Saves checkpoints in a loop until killed, for the kill -9 tests: step s holds
// weights all equal to s. Resumes after the newest good checkpoint it finds.
//   checkpoint_writer DIR [--async]
// Prints "saved N" once step N is durable: after save(N) returns, or with --async
// after save(N+1) returns (it waits for N's write, and throws if that failed). With
// --async the weights change to N+1 as soon as save(N) returns, while N is written.
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/comm/world.h"

int main(int argc, char** argv) {
  const bool async = argc == 3 && std::string(argv[2]) == "--async";
  if (argc != 2 && !async) {
    std::cerr << "usage: checkpoint_writer DIR [--async]\n";
    return 2;
  }
  auto world = cohort::comm::World::init();
  // Big enough (about 4 MB of weights, 12 MB with Adam's moments) that a save takes
  // long enough for a kill to land inside it.
  auto model = torch::nn::Sequential(torch::nn::Linear(512, 512), torch::nn::Linear(512, 512),
                                     torch::nn::Linear(512, 512), torch::nn::Linear(512, 512));
  torch::optim::Adam optimizer(model->parameters(), 1e-3);
  model->forward(torch::randn({2, 512})).sum().backward();
  optimizer.step();  // so that the optimizer has state to save
  cohort::checkpoint::Checkpointer checkpointer(argv[1], world.group(),
                                                cohort::checkpoint::CheckpointerOptions().keep_last(2).asynchronous(async));
  std::int64_t step = 1;
  if (auto restored = checkpointer.load_latest(*model, optimizer, torch::kCPU)) step = restored->progress.step + 1;
  std::int64_t pending = 0;  // --async: the step being written
  for (;; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.fill_(static_cast<double>(step));
    }
    checkpointer.save(*model, optimizer, {step, 0, 0, {}}, torch::kCPU);
    if (!async) std::cout << "saved " << step << std::endl;
    else if (pending > 0) std::cout << "saved " << pending << std::endl;
    pending = step;
  }
}
