#pragma once
// `cohort run`'s command line, spelled as torchrun spells it (dashes or underscores),
// and torchrun's PET_* environment variables (Note [PET variables]).
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/launcher/run_options.h"

namespace cohort::launcher {

// Parses the arguments after `run`, with `env` (the launcher's environment, read
// once by main) for the PET_* variables. Returns nullopt after printing help to
// `out` for --help. Throws UsageError for anything wrong, naming the flag or the
// variable.
//
// Note [PET variables]
// torchrun reads every flag from PET_<NAME> as well (the flag's name in upper case,
// dashes as underscores: PET_NPROC_PER_NODE, PET_NNODES, PET_RDZV_ENDPOINT,
// PET_MAX_RESTARTS, PET_STANDALONE=1, ...), and Kubeflow's PyTorchJob and TorchX
// configure jobs that way. So does `cohort run`: a flag on the command line wins,
// then the variable, then the default. An empty variable counts as unset, as
// CLI11 and torchrun's launcher both treat it.
std::optional<RunOptions> parse_run_command(const std::vector<std::string>& args, std::ostream& out,
                                            const comm::EnvMap& env = {});

}  // namespace cohort::launcher
