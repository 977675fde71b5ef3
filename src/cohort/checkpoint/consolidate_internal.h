#pragma once
// What `cohort checkpoint consolidate` writes, in memory, for the other converters
// (dcp/convert.cpp). Internal: not installed.
#include <ATen/core/Dict.h>

#include <cstdint>
#include <ostream>
#include <string>

#include "cohort/checkpoint/consolidate.h"

namespace cohort::checkpoint {

using GenericDict = c10::impl::GenericDict;

// {"model", "optimizer", "step", "epoch"} of the checkpoint `source` (a step-N
// directory or a directory of them), as consolidate_checkpoint describes; fills
// `report` but for bytes. Floats are 0-d float64 tensors there (Note [No floats for
// Python 1.13]).
GenericDict consolidated_state(const std::string& source, std::ostream& log, Consolidated& report);

// The same of a whole checkpoint's model.pt and optimizer.pt in memory (`source`
// names them in errors): what Format::kDcp writes.
GenericDict whole_state(const std::string& model_bytes, const std::string& optimizer_bytes, std::int64_t step,
                        std::int64_t epoch, const std::string& source);

}  // namespace cohort::checkpoint
