#include "peer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/checkpoint/torch_format.h"
#include "cohort/errors.h"

namespace gpt {

namespace tp = cohort::tensor_parallel;

c10::Dict<std::string, at::Tensor> whole_state(GptImpl& model, cohort::comm::Group& group) {
  // The dimension each TP slice was cut along (Note [Whole, then sliced]).
  std::map<const void*, int> split;
  for (const auto& m : model.modules()) {
    if (auto* c = dynamic_cast<tp::ColumnParallelLinearImpl*>(m.get())) {
      split[c->weight.unsafeGetTensorImpl()] = 0;
      if (c->bias.defined()) split[c->bias.unsafeGetTensorImpl()] = 0;
    } else if (auto* r = dynamic_cast<tp::RowParallelLinearImpl*>(m.get())) {
      split[r->weight.unsafeGetTensorImpl()] = 1;
    } else if (auto* e = dynamic_cast<tp::VocabParallelEmbeddingImpl*>(m.get())) {
      split[e->weight.unsafeGetTensorImpl()] = 0;
    }
  }
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) {
    const auto it = split.find(p.value().unsafeGetTensorImpl());
    auto value = p.value().detach();
    if (it != split.end() && group.size() > 1) value = torch::cat(group.all_gather(value.contiguous()), it->second);
    if (group.rank() == 0) out.insert(p.key(), value.cpu().clone());
  }
  for (const auto& b : model.named_buffers())
    if (group.rank() == 0) out.insert(b.key(), b.value().detach().cpu().clone());
  return out;
}

void save_whole_state(GptImpl& model, cohort::comm::Group& tp, bool write, const std::string& path) {
  auto state = whole_state(model, tp);
  if (!write) return;
  try {
    cohort::checkpoint::write_file_atomically(path, cohort::checkpoint::torch_save_bytes(state));
  } catch (const std::exception& e) {
    throw cohort::ConfigError(fmt::format("gpt: --save-initial {}: {}", path, e.what()));
  }
}

void dump_data(const TokenStreams& streams, int padded_vocab_size, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw cohort::ConfigError(fmt::format("gpt: --dump-data {}: cannot create it: {}", dir, ec.message()));
  write_tokens(dir + "/train.bin", streams.train);
  write_tokens(dir + "/val.bin", streams.validation);
  nlohmann::json meta = {{"vocab_size", streams.vocab_size},
                         {"padded_vocab_size", padded_vocab_size},
                         {"eos_id", streams.eos_id},
                         {"train_tokens", streams.train.size()},
                         {"validation_tokens", streams.validation.size()},
                         {"dtype", "int32"},
                         {"byte_order", "little"},
                         {"tokenizer", streams.folder + "/tokenizer.model"}};
  cohort::checkpoint::write_file_atomically(dir + "/meta.json", meta.dump(2) + "\n");
}

}  // namespace gpt
