// The smallest cohort program: every rank contributes rank+1, and every rank ends
// with 1 + 2 + ... + world_size. Run it with
//   cohort run --nproc-per-node 4 ./build/examples/hello_allreduce
// or alone as ./hello_allreduce (a world of one).
#include <torch/torch.h>

#include <iostream>

#include "cohort/comm/world.h"
#include "cohort/elastic/error_file.h"

int main() {
  return cohort::elastic::record([] {
    auto world = cohort::comm::World::init();
    auto value = torch::full({1}, static_cast<double>(world.rank() + 1), torch::kFloat64);
    world.group().all_reduce(value);
    const int n = world.size();
    std::cout << "rank " << world.rank() << " of " << n << " (" << world.backend_name() << " on "
              << world.device() << "): all_reduce(rank+1) = " << value.item<double>()
              << " (expected " << n * (n + 1) / 2 << ")" << std::endl;
    world.group().barrier();
    return value.item<double>() == n * (n + 1) / 2 ? 0 : 1;
  });
}
