#include "checkpoint_command.h"

#include <fmt/format.h>

#include "checkpoint_inspect.h"
#include "cohort/checkpoint/consolidate.h"
#include "cohort/checkpoint/dcp/convert.h"
#include "cohort/errors.h"

namespace cohort::tools {

namespace {

constexpr const char* kUsage =
    "usage: cohort checkpoint consolidate DIR OUT.pt\n"
    "  writes one file of a checkpoint, its optimizer shards merged, that Python reads with\n"
    "  torch.load(OUT.pt, weights_only=True): {\"model\", \"optimizer\", \"step\", \"epoch\"}.\n"
    "  DIR is a checkpoint (step-N) or a directory of them (the newest complete one is taken).\n"
    "  Runs offline, in one process, reading one shard at a time.\n"
    "usage: cohort checkpoint convert DIR OUT --to dcp [--optimizer adam|adamw|sgd]\n"
    "  writes the checkpoint as a PyTorch distributed checkpoint (the directory OUT, which must\n"
    "  not exist), which torch.distributed.checkpoint.load reads at any world size into\n"
    "  {\"model\": ..., \"optim\": ...} of get_state_dict(model, optimizer), and {\"train\": {\"step\",\n"
    "  \"epoch\"}}. --optimizer says which PyTorch optimizer the state is for (Adam's two kinds\n"
    "  look alike in LibTorch's files; SGD is recognised).\n"
    "usage: cohort checkpoint inspect DIR\n"
    "  prints what a checkpoint holds, in cohort's format or in PyTorch's distributed checkpoint\n"
    "  format (written by cohort or by dcp.save): its files, step, tensors (dtype, shape, chunks)\n"
    "  and values. For a directory of checkpoints, lists each, then shows the newest.\n"
    "  consolidate and convert read either format too.\n";

int consolidate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
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

int convert(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string to, optimizer;
  for (std::size_t i = 3; i < args.size(); i += 2) {
    if (i + 1 >= args.size() || (args[i] != "--to" && args[i] != "--optimizer")) {
      err << "cohort checkpoint convert: unexpected `" << args[i] << "`\n" << kUsage;
      return 2;
    }
    (args[i] == "--to" ? to : optimizer) = args[i + 1];
  }
  if (to != "dcp") {
    err << "cohort checkpoint convert: " << (to.empty() ? "give --to dcp" : "--to " + to + ": give --to dcp")
        << " (PyTorch's distributed checkpoint format, the one it converts to)\n"
        << kUsage;
    return 2;
  }
  try {
    const auto done = checkpoint::dcp::convert_to_dcp(args[1], args[2], optimizer, err);
    out << fmt::format(
        "cohort checkpoint: step {} of {} -> {} (PyTorch distributed checkpoint: {} tensors, {} values, {} "
        "bytes of data; optimizer {})\n",
        done.source.step, done.source.checkpoint, args[2], done.written.tensors, done.written.values,
        done.written.bytes, done.optimizer);
    return 0;
  } catch (const ConfigError& e) {
    err << "cohort checkpoint convert: " << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    err << "cohort checkpoint convert: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int checkpoint_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    out << kUsage;
    return 0;
  }
  if (args.size() == 3 && args[0] == "consolidate") return consolidate(args, out, err);
  if (args.size() >= 3 && args[0] == "convert") return convert(args, out, err);
  if (args.size() == 2 && args[0] == "inspect") return inspect_checkpoint(args[1], out, err);
  err << "cohort checkpoint: expected `consolidate DIR OUT.pt`, `convert DIR OUT --to dcp` or `inspect DIR`\n"
      << kUsage;
  return 2;
}

}  // namespace cohort::tools
