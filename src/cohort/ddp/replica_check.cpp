#include "cohort/ddp/replica_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cstring>
#include <sstream>

#include "cohort/errors.h"

namespace cohort::ddp {
namespace {

// One line per parameter; '\n' cannot occur in a parameter name.
std::string serialize(const std::vector<ParamDescription>& params) {
  std::string out;
  for (const auto& p : params) out += p.to_string() + "\n";
  return out;
}

// The text a rank sent, without the zero padding.
std::string unpad(const at::Tensor& bytes) {
  const char* raw = static_cast<const char*>(bytes.data_ptr());
  return std::string(raw, strnlen(raw, static_cast<std::size_t>(bytes.numel())));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// FNV-1a: stable across processes and builds, unlike std::hash.
std::int64_t digest(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<std::int64_t>(h);
}

std::string first_difference(const std::vector<std::string>& base, const std::vector<std::string>& other,
                             int other_rank) {
  for (std::size_t i = 0; i < std::max(base.size(), other.size()); ++i) {
    auto mine = i < base.size() ? "'" + base[i] + "'" : std::string("nothing");
    auto theirs = i < other.size() ? "'" + other[i] + "'" : std::string("nothing");
    if (mine != theirs)
      return fmt::format("parameter #{}: rank 0 has {}, rank {} has {}", i, mine, other_rank, theirs);
  }
  return "";
}

}  // namespace

std::string ParamDescription::to_string() const { return fmt::format("{} [{}] {}", name, fmt::join(sizes, ", "), dtype); }

std::vector<ParamDescription> describe_parameters(const torch::nn::Module& module) {
  std::vector<ParamDescription> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const auto& t = item.value();
    out.push_back({item.key(), t.sizes().vec(), std::string(t.dtype().name())});
  }
  return out;
}

// Note [The replica check's device]
// The check's tensors are made on the CPU, but NCCL moves only CUDA tensors, and
// each rank's on its own GPU: so they travel on the device of the parameters the
// caller checks. A caller over NCCL that has no CUDA parameter to name (none at all)
// gets the current CUDA device. Before this, every ShardedOptimizer and fully_shard
// over NCCL, even at world 1, refused to be built (the first run on a GPU).
void verify_replicas(comm::Group& group, const std::vector<ParamDescription>& params,
                     const ReplicaCheckWording& wording, c10::Device device) {
  if (group.backend_name() == "nccl" && !device.is_cuda()) device = c10::Device(c10::kCUDA);
  if (group.backend_name() != "nccl") device = c10::kCPU;
  auto gather = [&](const at::Tensor& t) {
    auto parts = group.all_gather(t.to(device));
    for (auto& p : parts) p = p.cpu();
    return parts;
  };
  const auto text = serialize(params);
  auto summary = torch::tensor({static_cast<std::int64_t>(params.size()), digest(text)}, torch::kInt64);
  auto summaries = gather(summary);
  bool same = true;
  for (const auto& s : summaries) same = same && torch::equal(s, summaries[0]);
  if (same) return;

  // Every rank saw the same summaries, so every rank takes this path.
  auto length = torch::tensor({static_cast<std::int64_t>(text.size())}, torch::kInt64);
  std::int64_t longest = 0;
  for (const auto& l : gather(length)) longest = std::max(longest, l.item<std::int64_t>());
  auto padded = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(padded.data_ptr(), text.data(), text.size());
  auto texts = gather(padded);
  auto base = lines_of(unpad(texts[0]));
  std::vector<int> differing;
  std::string first;
  for (int r = 1; r < group.size(); ++r) {
    auto diff = first_difference(base, lines_of(unpad(texts[r])), r);
    if (diff.empty()) continue;
    differing.push_back(r);
    if (first.empty()) first = diff;
  }
  throw ConfigError(fmt::format("{} on rank {}: {} differs across ranks ({} differ from rank 0: {}); first "
                                "difference: {}.\n  fix: {}",
                                wording.who, group.rank(), wording.what, differing.size() == 1 ? "rank" : "ranks",
                                fmt::join(differing, ", "), first, wording.fix));
}

}  // namespace cohort::ddp
