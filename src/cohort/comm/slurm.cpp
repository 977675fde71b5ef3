#include "cohort/comm/slurm.h"

#include <cstddef>

#include "cohort/errors.h"
#include "cohort/util/parse.h"

namespace cohort::comm::slurm {
namespace {

// Note [Bounded SLURM lists]
// SLURM's notations are compressed: "n[0-99999999]" is 12 bytes and a hundred million
// names, and "a[1-1000]b[1-1000]c[1-1000]" a billion. Expanding whatever the variable
// says would hang the worker and exhaust its memory before it ever reported a bad
// environment (found by fuzz_launcher_env). No SLURM job spans more than 65536 nodes
// (SLURM's own node count is far smaller in practice), so a list or a tasks-per-node
// spec that expands to more is refused with a ConfigError, checked before anything
// of that size is built. Counting the names is not enough: a group that expands to
// nothing ("[]") makes the product empty, after every name before it has been built
// ("a[0-370]b[0-370]c[0-370][]": 51 million steps and no name, again found by
// fuzz_launcher_env). So empty brackets are refused, and the expansion's steps are
// counted too: a real list takes at most a few per name (one per bracket group), and
// a list that takes more than kMaxSteps is refused as too large.
constexpr std::size_t kMaxNodes = 65536;
constexpr std::size_t kMaxSteps = 4 * kMaxNodes;

[[noreturn]] void too_many(const std::string& what, const std::string& text) {
  throw ConfigError(what + " '" + text + "' expands to more than " + std::to_string(kMaxNodes) +
                    " nodes; SLURM never gives that many, so the variable is corrupt");
}

// Splits on commas that are not inside brackets.
std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

// "01-03" -> {"01","02","03"}, keeping the zero padding of the lower bound.
std::vector<std::string> expand_range(const std::string& range,
                                      const std::string& hostlist) {
  auto dash = range.find('-');
  if (dash == std::string::npos) return {range};
  std::string lo = range.substr(0, dash);
  std::string hi = range.substr(dash + 1);
  long a = util::parse_long(lo, "a SLURM host range in '" + hostlist + "'");
  long b = util::parse_long(hi, "a SLURM host range in '" + hostlist + "'");
  if (b < a) throw ConfigError("SLURM host list '" + hostlist + "': range " + range + " is reversed");
  if (b - a >= static_cast<long>(kMaxNodes)) too_many("SLURM host list", hostlist);
  std::vector<std::string> out;
  for (long i = a; i <= b; ++i) {
    std::string n = std::to_string(i);
    if (n.size() < lo.size()) n.insert(0, lo.size() - n.size(), '0');
    out.push_back(n);
  }
  return out;
}

void expand_one(const std::string& item, const std::string& hostlist, std::vector<std::string>& out,
                std::size_t& steps) {
  if (++steps > kMaxSteps) too_many("SLURM host list", hostlist);
  auto open = item.find('[');
  if (open == std::string::npos) {
    if (out.size() >= kMaxNodes) too_many("SLURM host list", hostlist);
    out.push_back(item);
    return;
  }
  auto close = item.find(']', open);
  if (close == std::string::npos)
    throw ConfigError("SLURM host list '" + hostlist + "': unclosed '['");
  std::string prefix = item.substr(0, open);
  std::string rest = item.substr(close + 1);
  std::string inner = item.substr(open + 1, close - open - 1);
  const auto ranges = split_top_level(inner);
  if (ranges.empty()) throw ConfigError("SLURM host list '" + hostlist + "': empty brackets '[]'");
  for (const auto& range : ranges)
    for (const auto& n : expand_range(range, hostlist)) expand_one(prefix + n + rest, hostlist, out, steps);
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  std::vector<std::string> hosts;
  std::size_t steps = 0;  // Note [Bounded SLURM lists]
  for (const auto& item : split_top_level(hostlist)) expand_one(item, hostlist, hosts, steps);
  return hosts;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  std::vector<int> counts;
  for (const auto& item : split_top_level(spec)) {
    auto paren = item.find("(x");
    int tasks = static_cast<int>(util::parse_long(item.substr(0, paren), "SLURM_TASKS_PER_NODE"));
    long repeat = 1;
    if (paren != std::string::npos) {
      auto close = item.find(')', paren);
      if (close == std::string::npos)
        throw ConfigError("SLURM_TASKS_PER_NODE='" + spec + "': unclosed '(x'");
      repeat = util::parse_long(item.substr(paren + 2, close - paren - 2), "SLURM_TASKS_PER_NODE");
    }
    if (repeat < 0) throw ConfigError("SLURM_TASKS_PER_NODE='" + spec + "': a negative repeat count");
    if (static_cast<std::size_t>(repeat) > kMaxNodes - counts.size()) too_many("SLURM_TASKS_PER_NODE", spec);
    for (long i = 0; i < repeat; ++i) counts.push_back(tasks);
  }
  return counts;
}

}  // namespace cohort::comm::slurm
