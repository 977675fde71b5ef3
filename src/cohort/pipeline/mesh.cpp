#include "cohort/pipeline/mesh.h"

#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::pipeline {

Mesh::Mesh(const comm::World& world, int pipeline_size) : pipeline_size_(pipeline_size) {
  const int n = world.size();
  if (pipeline_size < 1 || n % pipeline_size != 0)
    throw ConfigError(fmt::format("cohort pipeline: {} ranks cannot form pipelines of {} stages; start a multiple "
                                  "of {} processes (--nproc-per-node), or choose a stage count that divides {}",
                                  n, pipeline_size, pipeline_size, n));
  data_size_ = n / pipeline_size;
  pipeline_rank_ = world.rank() % pipeline_size;
  data_rank_ = world.rank() / pipeline_size;
  // Every rank creates every group, in the same order (new_group is collective).
  for (int replica = 0; replica < data_size_; ++replica) {
    std::vector<int> ranks;
    for (int stage = 0; stage < pipeline_size; ++stage) ranks.push_back(global_rank(replica, stage));
    auto g = pipeline_size == n ? world.group() : world.new_group(ranks);
    if (replica == data_rank_) pipeline_group_ = g;
  }
  for (int stage = 0; stage < pipeline_size; ++stage) {
    std::vector<int> ranks;
    for (int replica = 0; replica < data_size_; ++replica) ranks.push_back(global_rank(replica, stage));
    auto g = data_size_ == n ? world.group() : world.new_group(ranks);
    if (stage == pipeline_rank_) data_group_ = g;
  }
}

}  // namespace cohort::pipeline
