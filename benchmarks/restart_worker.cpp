// The worker of benchmarks/compare_elastic.sh: a small DDP training loop that prints,
// as one JSON line per rank, when the process started, when its world was ready and
// when its first step completed (wall-clock milliseconds), with the restart count.
// The driver kills a worker and reads how long the restarted job took to step again.
// There is no checkpoint, so loading one is excluded by construction.
//   restart_worker [STEPS] [STEP_MS]
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "cohort/comm/world.h"
#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/elastic/error_file.h"

namespace {

long long wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int train(int argc, char** argv) {
  const long long started = wall_ms();
  const int steps = argc > 1 ? std::atoi(argv[1]) : 400;
  const int step_ms = argc > 2 ? std::atoi(argv[2]) : 10;
  auto world = cohort::comm::World::init();
  const long long ready = wall_ms();
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(256, 512), torch::nn::ReLU(), torch::nn::Linear(512, 10));
  cohort::ddp::DistributedDataParallel<torch::nn::Sequential> ddp(model, world.group());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const auto x = torch::randn({64, 256});
  const auto y = torch::randint(10, {64});
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(ddp(x), y).backward();
    optimizer.step();
    if (step == 0) {
      std::cout << "{\"rank\":" << world.rank() << ",\"restart\":" << (restart ? restart : "0")
                << ",\"start_ms\":" << started << ",\"ready_ms\":" << ready << ",\"first_step_ms\":" << wall_ms()
                << "}" << std::endl;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cohort::elastic::record([&] { return train(argc, argv); });
}
