#pragma once
// The settings every rank of the job must share (Note [Settings every rank shares]):
// compared across the world at start (cohort::comm::agree_on_settings, trainer.cpp),
// and across fault-tolerant replicas as the job's configuration (fault_tolerant.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/comm/config_agreement.h"
#include "options.h"

namespace fashion_mnist {

// `train_samples` and `test_samples`: the sizes of the data this rank read from its
// --data-dir, which stand for the path (each node may keep its copy where it likes).
std::vector<cohort::comm::Setting> shared_settings(const TrainerOptions& o, std::int64_t train_samples,
                                                   std::int64_t test_samples);

// The same as one line of text, "--epochs 2 --batch-size 32 ...", for
// ReplicaGroupOptions::configuration.
std::string as_configuration(const std::vector<cohort::comm::Setting>& settings);

}  // namespace fashion_mnist
