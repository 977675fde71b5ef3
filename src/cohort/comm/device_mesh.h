#pragma once
// The world's ranks laid out as data x pipeline x tensor parallel, like PyTorch's
// DeviceMesh with dimensions ("dp", "pp", "tp"). Tensor parallel ranks are the
// innermost, so consecutive ranks (one node's GPUs, which TP's per-layer collectives
// need) form a TP group; then the pipeline's stages; data parallel replicas are the
// outermost:
//
//   global rank = (data * pipeline_size + stage) * tensor_size + tensor
//
// With 8 ranks and shape (data 2, pipeline 2, tensor 2): TP groups {0,1} {2,3} {4,5}
// {6,7}; pipelines {0,2} {1,3} {4,6} {5,7}; data groups {0,4} {1,5} {2,6} {3,7}. With
// tensor 1 this is pipeline::Mesh's layout. Any size may be 1; that dimension's group
// is then this rank alone (no collective crosses it).
//
//   comm::DeviceMesh mesh(world, comm::MeshShape().tensor(2).pipeline(2));  // data: the rest
//   tp::ColumnParallelLinear up(mesh.group(comm::MeshDim::kTensor), ...);
//   DistributedDataParallel ddp(model, mesh.group(comm::MeshDim::kData));
//
// Building it is collective (World::new_group): every rank constructs the same mesh.
#include <torch/arg.h>

#include <array>

#include "cohort/comm/group.h"
#include "cohort/comm/world.h"

namespace cohort::comm {

enum class MeshDim { kData = 0, kPipeline = 1, kTensor = 2 };

struct MeshShape {
  // 0: whatever the world's size leaves once the other two are set.
  TORCH_ARG(int, data) = 0;
  TORCH_ARG(int, pipeline) = 1;
  TORCH_ARG(int, tensor) = 1;
};

class DeviceMesh {
 public:
  // ConfigError when the sizes do not multiply to the world's size.
  DeviceMesh(const World& world, MeshShape shape);

  int size(MeshDim dim) const { return sizes_[index(dim)]; }
  // This rank's position along `dim`.
  int coordinate(MeshDim dim) const { return coordinates_[index(dim)]; }
  // The ranks that differ from this one only along `dim`, in order of that coordinate.
  Group& group(MeshDim dim) { return groups_[index(dim)]; }
  int global_rank(int data, int stage, int tensor) const;
  // "dp 2 x pp 2 x tp 2"
  std::string describe() const;

 private:
  static std::size_t index(MeshDim d) { return static_cast<std::size_t>(d); }
  std::array<int, 3> sizes_{};
  std::array<int, 3> coordinates_{};
  std::array<Group, 3> groups_;
};

}  // namespace cohort::comm
