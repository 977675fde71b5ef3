// Trains a small GPT on the fortunes of Debian's `fortunes` package, split over a
// data x pipeline x tensor parallel mesh (docs/gpt.md):
//
//   cohort run --nproc-per-node 2 ./build/examples/gpt/gpt --tp 2 --steps 300
//
// Rank 0 prints the validation loss per evaluation, a few sampled lines, and one
// JSON line: {"val_loss": 4.1, "perplexity": 60, "tokens_per_second": 5000, ...}
#include <optional>

#include "cohort/elastic/error_file.h"
#include "cohort/errors.h"
#include "options.h"
#include "trainer.h"

// Note [Refusals reach the launcher] in examples/fashion_mnist/main.cpp: a refused
// flag is recorded as the cohort::ConfigError it is, and the trainer exits 2.
int main(int argc, char** argv) {
  std::optional<gpt::GptTrainerOptions> options;
  bool refused = false;
  const int status = cohort::elastic::record([&] {
    try {
      options = gpt::parse_options(argc, argv);
    } catch (const cohort::ConfigError&) {
      refused = true;
      throw;
    }
    return 0;
  });
  if (refused) return 2;
  if (status != 0 || !options) return status;  // --help
  return cohort::elastic::record([&] { return gpt::train(*options); });
}
