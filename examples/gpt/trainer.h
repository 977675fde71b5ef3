#pragma once
#include "options.h"

namespace gpt {

// Trains under `cohort run` (or alone, a world of one); rank 0 prints the validation
// loss per evaluation, the sample and one final JSON line. Returns the exit status.
int train(const GptTrainerOptions& o);

}  // namespace gpt
