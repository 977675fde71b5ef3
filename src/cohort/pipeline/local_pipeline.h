#pragma once
// Model parallelism in one process, over several devices: consecutive parts of a
// model live on given devices, activations move forward from device to device and
// autograd moves the gradients back (the seeds' model_parallel example). With
// micro-batches it is GPipe inside one process: one thread per device, so device
// k works on micro-batch m while device k+1 works on micro-batch m-1.
//
//   auto pipe = cohort::pipeline::LocalPipeline(
//       cohort::pipeline::split_by_balance(model, {3, 4}), {torch::Device("cuda:0"), torch::Device("cuda:1")},
//       cohort::pipeline::LocalPipelineOptions().microbatches(4));
//   auto out = pipe.forward(x);            // on cuda:1
//   loss_fn(out, y.to(out.device())).backward();
//
// "cpu" may be given for every device, which runs the same code on the CPU.
// The calling thread's state (grad mode, autocast, ...) is carried to the device
// threads (Note [State of the device threads]).
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <vector>

namespace cohort::pipeline {

struct LocalPipelineOptions {
  // Micro-batches per forward, cut along dimension 0; the last may be smaller.
  TORCH_ARG(int, microbatches) = 1;
};

class LocalPipeline {
 public:
  // Moves each part to its device. ConfigError when the counts differ or a part is empty.
  LocalPipeline(std::vector<torch::nn::Sequential> parts, std::vector<c10::Device> devices,
                LocalPipelineOptions options = LocalPipelineOptions());

  // The input may be on any device; the output is on the last device. An exception
  // in a part is rethrown naming the part and its device.
  at::Tensor forward(const at::Tensor& input);
  at::Tensor operator()(const at::Tensor& input) { return forward(input); }

  std::vector<at::Tensor> parameters() const;
  const std::vector<torch::nn::Sequential>& parts() const { return parts_; }
  const std::vector<c10::Device>& devices() const { return devices_; }
  void train(bool on = true);

 private:
  std::vector<torch::nn::Sequential> parts_;
  std::vector<c10::Device> devices_;
  LocalPipelineOptions options_;
};

}  // namespace cohort::pipeline
