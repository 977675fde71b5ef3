// `cohort run`'s command line and its PET_* variables (launcher/cli.h), then the
// checks of validate() (launcher/run_options.h), which read --rdzv-conf,
// --rdzv-endpoint, --nnodes and --nproc-per-node.
//
// Input: one selector byte, then
//   0: a --rdzv-conf value for parse_rdzv_conf() (elastic/rendezvous_state.h);
//   1: NUL-separated words; those of the form PET_NAME=VALUE are the environment,
//      the others the arguments after `cohort run`.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "cohort/elastic/rendezvous_state.h"
#include "cohort/launcher/cli.h"
#include "cohort/launcher/run_options.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  cohort::fuzz::expect_cohort_errors([&] {
    if (data[0] % 2 == 0) {
      const std::string conf(reinterpret_cast<const char*>(data) + 1, size - 1);
      (void)cohort::elastic::parse_rdzv_conf(conf, cohort::elastic::RendezvousSettings(1, 2));
      return;
    }
    std::vector<std::string> args;
    cohort::comm::EnvMap env;
    for (auto& word : cohort::fuzz::split(data + 1, size - 1, '\0')) {
      const auto eq = word.find('=');
      if (word.rfind("PET_", 0) == 0 && eq != std::string::npos) {
        env[word.substr(0, eq)] = word.substr(eq + 1);
      } else {
        args.push_back(std::move(word));
      }
    }
    std::ostringstream help;
    auto options = cohort::launcher::parse_run_command(args, help, env);
    if (options) cohort::launcher::validate(*options);
  });
  return 0;
}
