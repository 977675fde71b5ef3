#pragma once
// Aligning the ranks' timelines to rank 0's clock.
#include <c10/core/Device.h>

#include "cohort/comm/group.h"

namespace cohort::trace {

// Rank 0's steady clock minus this rank's, in microseconds; collective over `group`
// (Note [Aligned clocks]). `device` is where the group's tensors live.
double measure_clock_offset_us(comm::Group& group, c10::Device device);

}  // namespace cohort::trace
