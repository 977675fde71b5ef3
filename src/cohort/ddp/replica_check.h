#pragma once
// DDP's first duty at construction: make sure every rank wraps the same model.
//
// Note [Replica check without hangs]
// Ranks may disagree on the number of parameters, so no rank may issue a collective
// whose count or shape depends on its own model. The check therefore runs in steps
// whose shapes every rank knows in advance:
//  1. all_gather of a fixed 2-element int64 tensor: (parameter count, digest of the
//     whole description). If every row matches, the models agree: done.
//  2. Otherwise every rank has seen the same disagreement, so all of them go on:
//     all_gather of each rank's description length, then of the descriptions padded
//     to the longest. Every rank then finds the same first difference and throws the
//     same ConfigError. Nobody waits for a collective that another rank skipped.
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "cohort/comm/group.h"

namespace cohort::ddp {

struct ParamDescription {
  std::string name;
  std::vector<std::int64_t> sizes;
  std::string dtype;
  std::string to_string() const;  // "fc.weight [10, 5] float"
};

// The parameters of `module`, in registration order (named_parameters()).
std::vector<ParamDescription> describe_parameters(const torch::nn::Module& module);

// Who checks, for the error: "cohort DDP on rank R: the model differs ...".
struct ReplicaCheckWording {
  std::string who = "cohort DDP";
  std::string what = "the model";
  std::string fix = "build the same model on every rank, with the same constructor arguments, before wrapping it";
};

// Throws cohort::ConfigError on every rank when the ranks' descriptions differ,
// naming the first differing parameter and the ranks that differ from rank 0.
// `device`: where the check's collectives run, the parameters' device (over NCCL,
// this rank's GPU; Note [The replica check's device]).
void verify_replicas(comm::Group& group, const std::vector<ParamDescription>& params,
                     const ReplicaCheckWording& wording = ReplicaCheckWording(), c10::Device device = c10::kCPU);

}  // namespace cohort::ddp
