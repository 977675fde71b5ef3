#include "cohort/pipeline/wire.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::pipeline {

int transfer_tag(Direction direction, int stage, int microbatch, int slot) {
  return ((microbatch & 0x3FFF) << 16) | ((stage & 0xFF) << 8) | (static_cast<int>(direction) << 7) | (slot & 0x7F);
}

namespace {

const char* what(Direction d) { return d == Direction::kActivation ? "activations" : "gradients"; }

at::Tensor encode_header(const std::vector<at::Tensor>& tensors, Direction direction, int stage) {
  if (tensors.size() > static_cast<std::size_t>(kMaxWireTensors))
    throw ConfigError(fmt::format("cohort pipeline: stage {} passes {} {} tensors; at most {} fit one transfer. "
                                  "Concatenate some of them",
                                  stage, tensors.size(), what(direction), kMaxWireTensors));
  std::vector<std::int64_t> h{static_cast<std::int64_t>(tensors.size())};
  for (const auto& t : tensors) {
    if (!t.defined()) {
      h.push_back(-1);
      continue;
    }
    h.push_back(static_cast<std::int64_t>(t.scalar_type()));
    h.push_back(t.dim());
    for (auto s : t.sizes()) h.push_back(s);
  }
  if (h.size() > static_cast<std::size_t>(kHeaderSlots))
    throw ConfigError(fmt::format("cohort pipeline: the {} of stage {} have {} dimensions in all; at most {} fit "
                                  "one transfer. Flatten some of them",
                                  what(direction), stage, h.size(), kHeaderSlots));
  h.resize(kHeaderSlots, 0);
  return at::tensor(h, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

Sent send_tensors(comm::Group& group, const std::vector<at::Tensor>& tensors, int dst, Direction direction,
                  int stage, int microbatch, c10::Device device) {
  Sent sent;
  auto header = encode_header(tensors, direction, stage).to(device);
  sent.pending.push_back(group.send_async(header, dst, transfer_tag(direction, stage, microbatch, 0)));
  sent.keep.push_back(header);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    auto data = tensors[i].detach().contiguous();
    sent.pending.push_back(
        group.send_async(data, dst, transfer_tag(direction, stage, microbatch, static_cast<int>(i) + 1)));
    sent.keep.push_back(data);
  }
  return sent;
}

std::vector<at::Tensor> recv_tensors(comm::Group& group, int src, Direction direction, int stage, int microbatch,
                                     c10::Device device) {
  auto header = at::empty({kHeaderSlots}, at::TensorOptions().dtype(at::kLong).device(device));
  group.recv(header, src, transfer_tag(direction, stage, microbatch, 0));
  auto h = header.cpu();
  const auto* v = h.data_ptr<std::int64_t>();
  const auto count = v[0];
  TORCH_INTERNAL_ASSERT(count >= 0 && count <= kMaxWireTensors, "a pipeline header with ", count, " tensors");
  std::vector<at::Tensor> out;
  std::vector<comm::Pending> pending;
  std::size_t k = 1;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto dtype = v[k++];
    if (dtype < 0) {
      out.emplace_back();
      continue;
    }
    const auto dim = v[k++];
    std::vector<std::int64_t> sizes(v + k, v + k + dim);
    k += static_cast<std::size_t>(dim);
    auto t = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype)).device(device));
    pending.push_back(group.recv_async(t, src, transfer_tag(direction, stage, microbatch, static_cast<int>(i) + 1)));
    out.push_back(t);
  }
  for (auto& p : pending) p.wait();
  return out;
}

}  // namespace cohort::pipeline
