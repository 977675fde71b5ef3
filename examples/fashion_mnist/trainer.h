#pragma once
#include "options.h"

namespace fashion_mnist {

// Joins the world from the launcher's environment, trains, evaluates, and (on rank 0)
// prints progress and a final JSON line. Returns the exit status.
int train(const TrainerOptions& options);

}  // namespace fashion_mnist
