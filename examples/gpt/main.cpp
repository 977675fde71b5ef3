// Trains a small GPT on the fortunes of Debian's `fortunes` package, split over a
// data x pipeline x tensor parallel mesh (docs/gpt.md):
//
//   cohort run --nproc-per-node 2 ./build/examples/gpt/gpt --tp 2 --steps 300
//
// Rank 0 prints the validation loss per evaluation, a few sampled lines, and one
// JSON line: {"val_loss": 4.1, "perplexity": 60, "tokens_per_second": 5000, ...}
#include "cohort/elastic/error_file.h"
#include "options.h"
#include "trainer.h"

int main(int argc, char** argv) {
  auto options = gpt::parse_options(argc, argv);
  if (!options) return 0;
  return cohort::elastic::record([&] { return gpt::train(*options); });
}
