#include "trace_command.h"

#include <fmt/format.h>

#include "cohort/errors.h"
#include "cohort/trace/chrome_trace.h"

namespace cohort::tools {

int trace_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  constexpr const char* kUsage =
      "usage: cohort trace merge DIR OUT.json\n"
      "  merges the rank-N.json files that `cohort run --timeline DIR` wrote into one Chrome trace\n"
      "  (one process per rank) for ui.perfetto.dev or chrome://tracing\n";
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    out << kUsage;
    return 0;
  }
  if (args.size() != 3 || args[0] != "merge") {
    err << "cohort trace: expected `merge DIR OUT.json`\n" << kUsage;
    return 2;
  }
  try {
    const auto merged = trace::merge_chrome_traces(args[1], args[2]);
    out << fmt::format("cohort trace: merged {} events of {} rank(s) into {}\n", merged.events, merged.ranks.size(),
                       args[2]);
    return 0;
  } catch (const Error& e) {
    err << "cohort trace merge: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace cohort::tools
