#include <cohort/checkpoint/atomic_file.h>
#include <cohort/checkpoint/checkpointer.h>
#include <cohort/comm/world.h>
#include <cohort/data/distributed_sampler.h>
#include <torch/torch.h>

#include <iostream>

// Uses the installed headers and library the way a user's project does: a world, a
// collective, a sampler and the checkpoint types (whose library needs zlib).
int main() {
  auto world = cohort::comm::World::init();
  auto t = torch::full({1}, 41.0) + world.rank() + 1;
  world.group().all_reduce(t);
  cohort::data::DistributedSampler sampler(10, cohort::data::DistributedSamplerOptions(world.rank(), world.size()));
  const auto first = sampler.next(10);
  cohort::checkpoint::TrainingProgress progress{0, 0, 0, sampler.state()};
  std::cout << "consumer: rank " << world.rank() << " of " << world.size() << " got " << t.item<double>() << ", "
            << first->size() << " samples, consumed " << progress.sampler->consumed << ", crc "
            << cohort::checkpoint::crc32_of("cohort") << "\n";
  return t.item<double>() == 42.0 * world.size() + world.size() * (world.size() - 1) / 2.0 ? 0 : 1;
}
