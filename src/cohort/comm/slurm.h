#pragma once
// Pure helpers for SLURM's compressed notations.
#include <string>
#include <vector>

namespace cohort::comm::slurm {

// "node[01-03,07],gpu-a" -> {"node01","node02","node03","node07","gpu-a"}.
// Several bracket groups in one name ("r[1-2]-n[1-2]") expand as a product.
std::vector<std::string> expand_hostlist(const std::string& hostlist);

// SLURM_TASKS_PER_NODE: "2(x3),1" -> {2,2,2,1}.
std::vector<int> expand_tasks_per_node(const std::string& spec);

}  // namespace cohort::comm::slurm
