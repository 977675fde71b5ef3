#include "cohort/comm/device_mesh.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "cohort/errors.h"

namespace cohort::comm {

DeviceMesh::DeviceMesh(const World& world, MeshShape shape) {
  const int n = world.size();
  const int pipeline = shape.pipeline(), tensor = shape.tensor();
  if (pipeline < 1 || tensor < 1 || shape.data() < 0)
    throw ConfigError(fmt::format("cohort DeviceMesh: sizes must be positive (data {}, pipeline {}, tensor {}; data "
                                  "0 means the rest of the world)",
                                  shape.data(), pipeline, tensor));
  const int data = shape.data() > 0 ? shape.data() : n / (pipeline * tensor);
  if (data < 1 || data * pipeline * tensor != n)
    throw ConfigError(fmt::format("cohort DeviceMesh: {} ranks cannot form a mesh of data {} x pipeline {} x tensor {}; "
                                  "start data x pipeline x tensor processes, or choose sizes whose product is {}",
                                  n, shape.data() > 0 ? std::to_string(shape.data()) : std::string("(the rest)"),
                                  pipeline, tensor, n));
  sizes_ = {data, pipeline, tensor};
  const int r = world.rank();
  coordinates_ = {r / (pipeline * tensor), (r / tensor) % pipeline, r % tensor};
  // Every rank creates every group of every dimension, in the same order: new_group
  // is collective. A dimension of size 1 needs no group of its own but the same
  // calls on every rank; one spanning the world is the world's group.
  for (std::size_t d = 0; d < 3; ++d) {
    if (sizes_[d] == n) {
      groups_[d] = world.group();
      continue;
    }
    // Enumerate the lines along dimension d: every combination of the other two.
    std::array<int, 3> at{};
    const std::size_t a = (d + 1) % 3, b = (d + 2) % 3;
    for (at[a] = 0; at[a] < sizes_[a]; ++at[a])
      for (at[b] = 0; at[b] < sizes_[b]; ++at[b]) {
        std::vector<int> ranks;
        for (at[d] = 0; at[d] < sizes_[d]; ++at[d]) ranks.push_back(global_rank(at[0], at[1], at[2]));
        auto g = world.new_group(ranks);
        if (at[a] == coordinates_[a] && at[b] == coordinates_[b]) groups_[d] = g;
      }
  }
}

int DeviceMesh::global_rank(int data, int stage, int tensor) const {
  return (data * sizes_[1] + stage) * sizes_[2] + tensor;
}

std::string DeviceMesh::describe() const {
  return fmt::format("dp {} x pp {} x tp {}", sizes_[0], sizes_[1], sizes_[2]);
}

}  // namespace cohort::comm
