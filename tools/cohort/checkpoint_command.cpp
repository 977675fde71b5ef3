#include "checkpoint_command.h"

#include <fmt/format.h>

#include "cohort/checkpoint/consolidate.h"
#include "cohort/errors.h"

namespace cohort::tools {

int checkpoint_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  constexpr const char* kUsage =
      "usage: cohort checkpoint consolidate DIR OUT.pt\n"
      "  writes one file of a checkpoint, its optimizer shards merged, that Python reads with\n"
      "  torch.load(OUT.pt, weights_only=True): {\"model\", \"optimizer\", \"step\", \"epoch\"}.\n"
      "  DIR is a checkpoint (step-N) or a directory of them (the newest complete one is taken).\n"
      "  Runs offline, in one process, reading one shard at a time.\n";
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    out << kUsage;
    return 0;
  }
  if (args.size() != 3 || args[0] != "consolidate") {
    err << "cohort checkpoint: expected `consolidate DIR OUT.pt`\n" << kUsage;
    return 2;
  }
  try {
    const auto done = checkpoint::consolidate_checkpoint(args[1], args[2], err);
    out << fmt::format(
        "cohort checkpoint: step {} of {} ({} optimizer file(s), {} of {} parameters with a state) -> {} ({} "
        "bytes)\n",
        done.step, done.checkpoint, done.shards, done.with_state, done.parameters, args[2], done.bytes);
    return 0;
  } catch (const Error& e) {
    err << "cohort checkpoint consolidate: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace cohort::tools
