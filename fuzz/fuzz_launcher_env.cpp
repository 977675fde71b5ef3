// The launchers' environments (comm/environment.h): torchrun's, SLURM's and Open
// MPI's variables, and SLURM's compressed node and task lists (comm/slurm.h).
//
// Input: one selector byte, then
//   0: NAME=VALUE lines, the environment world_info_from() reads;
//   1: a SLURM node list for expand_hostlist();
//   2: a SLURM_TASKS_PER_NODE value for expand_tasks_per_node().
#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/comm/environment.h"
#include "cohort/comm/slurm.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  cohort::fuzz::expect_cohort_errors([&] {
    switch (data[0] % 3) {
      case 0: {
        cohort::comm::EnvMap env;
        for (const auto& line : cohort::fuzz::split(data + 1, size - 1, '\n')) {
          const auto eq = line.find('=');
          if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
        }
        auto w = cohort::comm::world_info_from(env);
        // What the rest of cohort relies on once the environment is accepted.
        if (w.rank < 0 || w.rank >= w.world_size || w.local_rank < 0 || w.local_rank >= w.local_world_size ||
            w.local_world_size > w.world_size)
          std::abort();
        (void)w.all_on_this_host();
        break;
      }
      case 1: (void)cohort::comm::slurm::expand_hostlist(rest); break;
      default: (void)cohort::comm::slurm::expand_tasks_per_node(rest); break;
    }
  });
  return 0;
}
