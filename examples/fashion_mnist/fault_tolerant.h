#pragma once
// --fault-tolerance: the trainer's loop over a cohort::fault_tolerance::ReplicaGroup
// instead of a fixed World. A lost replica costs the step in flight, which the
// survivors redo at once; its replacement takes the weights from a live replica.
#include "options.h"

namespace fashion_mnist {

int train_fault_tolerant(const TrainerOptions& o);

}  // namespace fashion_mnist
