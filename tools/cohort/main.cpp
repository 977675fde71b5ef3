// The `cohort` command: `cohort run` (the launcher), `cohort info`, `cohort trace` and
// `cohort checkpoint`.
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/launcher/agent.h"
#include "cohort/launcher/cli.h"
#include "cohort/launcher/console_relay.h"
#include "checkpoint_command.h"
#include "info_command.h"
#include "trace_command.h"

namespace {

constexpr const char* kUsage =
    "usage: cohort <command> [args]\n"
    "\n"
    "commands:\n"
    "  run    start a program as a group of training workers (torchrun-compatible);\n"
    "         see `cohort run --help`\n"
    "  info   print the LibTorch version, the backends compiled in, the devices seen, the\n"
    "         BLAS and thread settings and a measured GEMM rate (--json: one machine-readable\n"
    "         line; --no-gemm: skip the measurement)\n"
    "  trace  `trace merge DIR OUT.json`: merge the ranks' timelines of `cohort run --timeline DIR`\n"
    "  checkpoint  `checkpoint consolidate DIR OUT.pt`: one file of a (sharded) checkpoint that\n"
    "         Python's torch.load(..., weights_only=True) reads; `checkpoint convert DIR OUT --to dcp`:\n"
    "         a PyTorch distributed checkpoint (torch.distributed.checkpoint.load); `checkpoint inspect\n"
    "         DIR`: what a checkpoint in either format holds\n"
    "  --version\n";

int run_command(const std::vector<std::string>& args) {
  // The environment is read once, here: the flags' PET_* variables and the workers'
  // base environment come from the same map.
  const auto env = cohort::comm::process_environment();
  auto options = cohort::launcher::parse_run_command(args, std::cout, env);
  if (!options) return 0;  // --help
  // Note [Never stalled by the console]: from here on, a console that stops reading
  // costs lines, never the job. Asked first: the relay's pipes are no terminals.
  options->stdout_is_tty = ::isatty(STDOUT_FILENO) == 1;
  options->stderr_is_tty = ::isatty(STDERR_FILENO) == 1;
  cohort::launcher::ConsoleRelay relay({STDOUT_FILENO, STDERR_FILENO});
  const int code = cohort::launcher::run_agent(*options, env, cohort::launcher::detect_resources());
  relay.finish();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "run") return run_command(args);
    if (command == "info") {
      cohort::tools::InfoOptions options;
      for (const auto& a : args) {
        if (a == "--json") {
          options.json = true;
        } else if (a == "--no-gemm") {
          options.measure_gemm = false;
        } else {
          std::cerr << "cohort info: unexpected argument '" << a << "'; usage: cohort info [--json] [--no-gemm]\n";
          return 2;
        }
      }
      return cohort::tools::info_command(options, std::cout, std::cerr);
    }
    if (command == "trace") return cohort::tools::trace_command(args, std::cout, std::cerr);
    if (command == "checkpoint") return cohort::tools::checkpoint_command(args, std::cout, std::cerr);
    if (command == "--version") {
      std::cout << "cohort " << COHORT_VERSION << "\n";
      return 0;
    }
    std::cerr << "cohort: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const cohort::launcher::UsageError& e) {
    std::cerr << "cohort " << command << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cohort " << command << ": " << e.what() << "\n";
    return 1;
  }
}
