#include <cohort/comm/world.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  auto world = cohort::comm::World::init();
  auto t = torch::full({1}, 41.0) + world.rank() + 1;
  world.group().all_reduce(t);
  std::cout << "consumer: rank " << world.rank() << " of " << world.size() << " got " << t.item<double>() << "\n";
  return t.item<double>() == 42.0 * world.size() + world.size() * (world.size() - 1) / 2.0 ? 0 : 1;
}
