// Trains a small CNN on Fashion-MNIST across processes: cohort's
// DistributedDataParallel, DistributedSampler and checkpoints on real data.
//
//   cohort run --nproc-per-node 2 ./build/examples/fashion_mnist/fashion_mnist
//       --epochs 2 --checkpoint-dir /tmp/fmnist-ckpt
//
// Rank 0 shows progress and ends with one JSON line:
//   {"test_accuracy": 0.91, "test_loss": 0.25, "samples_per_second": 1900, ...}
#include "cohort/elastic/error_file.h"
#include "options.h"
#include "trainer.h"

int main(int argc, char** argv) {
  auto options = fashion_mnist::parse_options(argc, argv);
  if (!options) return 0;
  return cohort::elastic::record([&] { return fashion_mnist::train(*options); });
}
