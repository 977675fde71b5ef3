#pragma once
// A 2-D layout of the world's ranks for data parallel x pipeline parallel training,
// like PyTorch's DeviceMesh with dimensions ("dp", "pp"). Pipeline ranks are
// consecutive: global rank = replica * stages + stage. With 4 ranks and 2 stages,
// the pipelines are {0, 1} and {2, 3} and the data-parallel groups {0, 2} and {1, 3}.
//
//   auto mesh = cohort::pipeline::Mesh(world, /*pipeline_size=*/2);
//   Pipeline pipe(my_stages(mesh.pipeline_rank()), mesh.pipeline_group(), options);
//   pipe.data_parallel(mesh.data_group());
//
// Building it is collective (World::new_group): every rank constructs the same mesh.
#include "cohort/comm/group.h"
#include "cohort/comm/world.h"

namespace cohort::pipeline {

class Mesh {
 public:
  // ConfigError unless pipeline_size divides the world size.
  Mesh(const comm::World& world, int pipeline_size);

  int pipeline_size() const { return pipeline_size_; }
  int data_size() const { return data_size_; }
  int pipeline_rank() const { return pipeline_rank_; }  // this rank's stage position
  int data_rank() const { return data_rank_; }          // this rank's replica
  // The global rank at (replica, stage).
  int global_rank(int replica, int stage) const { return replica * pipeline_size_ + stage; }
  comm::Group& pipeline_group() { return pipeline_group_; }
  comm::Group& data_group() { return data_group_; }

 private:
  int pipeline_size_, data_size_, pipeline_rank_, data_rank_;
  comm::Group pipeline_group_, data_group_;
};

}  // namespace cohort::pipeline
