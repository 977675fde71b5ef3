// Trains a small CNN on Fashion-MNIST across processes: cohort's
// DistributedDataParallel, DistributedSampler and checkpoints on real data.
//
//   cohort run --nproc-per-node 2 ./build/examples/fashion_mnist/fashion_mnist
//       --epochs 2 --checkpoint-dir /tmp/fmnist-ckpt
//
// Rank 0 shows progress and ends with one JSON line:
//   {"test_accuracy": 0.91, "test_loss": 0.25, "samples_per_second": 1900, ...}
#include <optional>

#include "cohort/elastic/error_file.h"
#include "cohort/errors.h"
#include "options.h"
#include "trainer.h"

// Note [Refusals reach the launcher]
// A flag the trainer refuses is a cohort::ConfigError, recorded like any error
// (cohort::elastic::record writes the launcher's error file), so that `cohort run`
// knows it for what it is: under --fault-tolerance in-process it does not replace the
// worker, which would only refuse again (Note [A restart that cannot help] in
// launcher/in_process.h), and the job exits 2 (Note [A job that ends on a
// configuration error] in launcher/agent.cpp). Run alone, the trainer exits 2 too, as
// command-line tools do on bad input. Before, the refusal was a bare exit(2) with no
// error file: under --fault-tolerance every restart was spent on it.
int main(int argc, char** argv) {
  std::optional<fashion_mnist::TrainerOptions> options;
  bool refused = false;
  const int status = cohort::elastic::record([&] {
    try {
      options = fashion_mnist::parse_options(argc, argv);
    } catch (const cohort::ConfigError&) {
      refused = true;
      throw;
    }
    return 0;
  });
  if (refused) return 2;
  if (status != 0 || !options) return status;  // --help
  return cohort::elastic::record([&] { return fashion_mnist::train(*options); });
}
