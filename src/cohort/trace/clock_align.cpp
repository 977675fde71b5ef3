#include "cohort/trace/clock_align.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <vector>

#include "cohort/trace/timeline.h"
#include "cohort/util/host.h"

namespace cohort::trace {
namespace {

// Processes that share a kernel (one host, or network namespaces on it) share its
// monotonic clock: the boot id names that clock.
std::int64_t clock_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  if (boot_id.empty()) boot_id = util::host_name();
  return static_cast<std::int64_t>(std::hash<std::string>{}(boot_id) >> 1);
}

}  // namespace

// Note [Aligned clocks]
// Each rank stamps its events with its own steady clock. Ranks on one host already
// share that clock, so their offset is exactly 0, and measuring it would only add
// noise. Across hosts the ranks leave a barrier together, within its last
// message's latency (tens of microseconds on a LAN), read their clocks, and take
// rank 0's reading: the offset is the difference. Five rounds, the median kept,
// so one descheduled rank does not skew it. Steps are milliseconds long, so that
// error is below what a timeline is read for.
double measure_clock_offset_us(comm::Group& group, c10::Device device) {
  const auto on = at::TensorOptions().device(device);
  auto id = at::full({1}, clock_identity(), on.dtype(at::kLong));
  group.broadcast(id, 0);
  const bool same_clock = id.item<std::int64_t>() == clock_identity();
  auto all_same = at::full({1}, same_clock ? 0 : 1, on.dtype(at::kLong));
  group.all_reduce(all_same);
  if (all_same.item<std::int64_t>() == 0) return 0;
  std::vector<double> offsets;
  for (int round = 0; round < 5; ++round) {
    group.barrier();
    const double mine = Timeline::now_us();
    auto theirs = at::full({1}, mine, on.dtype(at::kDouble));
    group.broadcast(theirs, 0);
    offsets.push_back(theirs.item<double>() - mine);
  }
  if (same_clock) return 0;  // a host shared with rank 0 among hosts that are not
  std::nth_element(offsets.begin(), offsets.begin() + 2, offsets.end());
  return offsets[2];
}

}  // namespace cohort::trace
