#include "cohort/zero/state_bytes.h"

#include <torch/optim.h>
#include <torch/serialize.h>

#include <sstream>

namespace cohort::zero {
namespace {

std::int64_t bytes_of(std::initializer_list<at::Tensor> tensors) {
  std::int64_t total = 0;
  for (const auto& t : tensors)
    if (t.defined()) total += static_cast<std::int64_t>(t.nbytes());
  return total;
}

std::int64_t serialized_bytes(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive archive;
  state.serialize(archive);
  std::ostringstream out;
  archive.save_to(out);
  return static_cast<std::int64_t>(out.str().size());
}

std::int64_t bytes_of(const torch::optim::OptimizerParamState& s) {
  using namespace torch::optim;
  if (auto* p = dynamic_cast<const SGDParamState*>(&s)) return bytes_of({p->momentum_buffer()});
  if (auto* p = dynamic_cast<const AdamParamState*>(&s))
    return bytes_of({p->exp_avg(), p->exp_avg_sq(), p->max_exp_avg_sq()});
  if (auto* p = dynamic_cast<const AdamWParamState*>(&s))
    return bytes_of({p->exp_avg(), p->exp_avg_sq(), p->max_exp_avg_sq()});
  if (auto* p = dynamic_cast<const AdagradParamState*>(&s)) return bytes_of({p->sum()});
  if (auto* p = dynamic_cast<const RMSpropParamState*>(&s))
    return bytes_of({p->square_avg(), p->momentum_buffer(), p->grad_avg()});
  return serialized_bytes(s);
}

}  // namespace

std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t total = 0;
  for (const auto& entry : optimizer.state())
    if (entry.second) total += bytes_of(*entry.second);
  return total;
}

}  // namespace cohort::zero
