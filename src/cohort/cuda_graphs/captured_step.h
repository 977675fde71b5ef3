#pragma once
// CapturedStep: a whole training step (forward, backward, DDP's bucketed all-reduce
// over NCCL, the optimizer's step) captured once into a CUDA graph and replayed,
// so that the host launches one graph per step instead of hundreds of kernels
// (docs/cuda_graphs.md). PyTorch's DDP cannot be captured (pytorch/pytorch#89546).
//
//   cohort::optim::AdamW opt(ddp.module()->parameters(), options);
//   opt.capturable(true);                        // Note [A step inside a CUDA graph]
//   auto x = torch::empty({B, 1, 28, 28}, cuda), y = torch::empty({B}, cuda.dtype(torch::kLong));
//   // DDP built on the capture stream (Note [Gradient accumulators on the capture stream]):
//   auto stream = cohort::cuda_graphs::capture_stream(cuda);
//   std::optional<cohort::ddp::DistributedDataParallel<Net>> ddp;
//   { c10::StreamGuard on(stream); ddp.emplace(model, world.group()); }
//   stream.synchronize();                        // its broadcast done before others read
//   cohort::cuda_graphs::CapturedStep step([&] {  // reads x and y, returns the loss
//     opt.zero_grad();
//     auto loss = torch::nn::functional::cross_entropy((*ddp)(x), y);
//     loss.backward();
//     opt.step();
//     return loss.detach();
//   }, cohort::cuda_graphs::CapturedStepOptions(cuda).stream(stream));
//   step.use(*ddp).use(opt);
//   for (auto& batch : loader) {
//     x.copy_(batch.data, /*non_blocking=*/true);  // same shapes every step
//     y.copy_(batch.target, true);
//     opt.param_groups()[0].options().set_lr(schedule(step_number));
//     auto loss = step.run();                    // valid until the next run()
//   }
//
// Note [One graph for the whole step]
//  - run() calls the step eagerly for warmup_steps() steps (real training steps, on
//    a side stream, as PyTorch's recipe does: libraries allocate their workspaces,
//    NCCL its communicators, DDP rebuilds its buckets), then captures it once on
//    that stream and replays it, that step and every later one. A capture records
//    kernels without running them, so the capturing call replays the graph too.
//  - The step must do the same on the host every time: the same shapes (copy each
//    batch into the same input tensors; a batch of another shape throws), no read of
//    a device value (item(), a loss printed each step), no host-side decision.
//    Memory the step allocates while captured comes from the graph's own pool and
//    keeps its address on every replay, which is why the returned loss and the
//    gradients stay valid until the next run().
//  - What changes between steps lives in device tensors: the optimizer's learning
//    rate and step counts (optim/capturable.h), loaded before each run().
//  - DDP's reducer sees the capture and makes the stream, not the host, wait for
//    its buckets (Note [DDP inside a CUDA graph] in ddp/step_end.cpp); what a replay
//    cannot do is refused first, with the fix (why_not_capturable). Capturing inside
//    DDP's join() is not supported: its rounds read the host.
//  - What is not captured is refused when run() first captures, not guessed at.
// Built only with a CUDA LibTorch (COHORT_HAVE_NCCL: every CUDA build of LibTorch
// that cohort supports has NCCL); elsewhere the constructor throws ConfigError.
// Not yet run on a GPU (docs/gpu_results.md keeps the list).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <torch/arg.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/ddp/distributed_data_parallel.h"
#include "cohort/errors.h"
#include "cohort/optim/capturable.h"

#ifdef COHORT_HAVE_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#endif

namespace cohort::cuda_graphs {

struct CapturedStepOptions {
  explicit CapturedStepOptions(c10::Device device) : device_(device) {}
  // The CUDA device the step runs on.
  TORCH_ARG(c10::Device, device);
  // The stream the warm-up and the capture run on, and on which DDP must have been
  // built (Note [Gradient accumulators on the capture stream]); capture_stream().
  TORCH_ARG(std::optional<c10::Stream>, stream) = std::nullopt;
  // Eager steps before the capture: at least 2 with DDP (its bucket rebuild, at the
  // second forward, must come first), and 1 for the optimizer's state.
  TORCH_ARG(int, warmup_steps) = 3;
};

// Whether this build can capture CUDA graphs at all, and if not why (with the fix).
inline std::string why_no_cuda_graphs(const c10::Device& device) {
#ifdef COHORT_HAVE_NCCL
  if (!device.is_cuda())
    return "CUDA graphs capture CUDA kernels, and the step runs on " + device.str() + "; fix: run on a GPU (--device cuda)";
  return "";
#else
  (void)device;
  return "this LibTorch has no CUDA, and CUDA graphs need it; fix: link a CUDA build of LibTorch (pip's torch, the "
         "official CUDA zip) and run on a GPU";
#endif
}

// Why this DDP's step cannot be captured, with the fix; "" when it can (Note [DDP
// inside a CUDA graph] in ddp/step_end.cpp).
inline std::string why_not_capturable(ddp::DistributedDataParallelBase& ddp) {
  const auto& o = ddp.options();
  if (o.find_unused_parameters() || o.static_graph())
    return "find_unused_parameters and static_graph search for unused parameters on the host in each step, which a "
           "replay cannot; fix: make every parameter contribute to the loss and turn both off";
  if (o.comm_hook())
    return "its comm hook '" + o.comm_hook()->name() + "' may keep host state between steps; fix: capture with the "
           "default all-reduce";
  if (o.record_timings() || ddp.group().recorder())
    return "it times its buckets (record_timings, or a timeline), which queries events on the host; fix: turn "
           "record_timings and the timeline off";
  if (o.broadcast_buffers() && !ddp.wrapped().buffers().empty())
    return "it broadcasts the module's buffers before each forward, a collective the host waits for; fix: "
           "DistributedDataParallelOptions().broadcast_buffers(false)";
  for (const char* name : {"TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"}) {
    const char* v = std::getenv(name);
    if (v && std::string(v) != "0" && !std::string(v).empty())
      return std::string(name) + "=" + v + " makes NCCL's wait poll its event on the host, which a capture forbids; "
             "fix: unset it (NCCL's watchdog still bounds each collective by the group's timeout)";
  }
  if (!ddp.reducer().rebuilt())
    return "its buckets are not rebuilt yet (the rebuild, at the second step's forward, reads the host: Note "
           "[Rebuilding buckets]); fix: run at least two steps eagerly first (CapturedStepOptions::warmup_steps)";
  const auto backend = ddp.group().backend_name();
  if (backend != "nccl")
    return "its group runs " + backend + ", and only NCCL's collectives can be captured into a CUDA graph; fix: use "
           "the nccl backend (cohort run --backend nccl)";
  return "";
}

// A stream of `device` for CapturedStepOptions::stream: build DDP under a
// c10::StreamGuard of it. Throws ConfigError where there is no CUDA.
inline c10::Stream capture_stream(const c10::Device& device) {
  const auto why = why_no_cuda_graphs(device);
  if (!why.empty()) throw ConfigError("cohort capture_stream: " + why);
#ifdef COHORT_HAVE_NCCL
  const auto index = device.index() < 0 ? c10::cuda::current_device() : device.index();
  return c10::cuda::getStreamFromPool(false, index).unwrap();
#else
  return c10::Stream(c10::Stream::DEFAULT, device);  // unreachable: refused above
#endif
}

class CapturedStep {
 public:
  using Step = std::function<at::Tensor()>;
  CapturedStep(Step step, CapturedStepOptions options) : step_(std::move(step)), options_(std::move(options)) {
    const auto why = why_no_cuda_graphs(options_.device());
    if (!why.empty()) throw ConfigError("cohort CapturedStep: " + why);
    if (options_.warmup_steps() < 1)
      throw ConfigError("cohort CapturedStep: warmup_steps(" + std::to_string(options_.warmup_steps()) +
                        ") must be at least 1 (2 with DDP): the first step must run eagerly");
#ifdef COHORT_HAVE_NCCL
    const auto stream = options_.stream() ? *options_.stream() : capture_stream(options_.device());
    if (stream.device_type() != c10::kCUDA)
      throw ConfigError("cohort CapturedStep: the stream given is on " + stream.device().str() + ", not CUDA");
    side_ = std::make_unique<c10::cuda::CUDAStream>(stream);
#endif
  }
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // The DDP the step runs through: captured under its capture() guard.
  CapturedStep& use(ddp::DistributedDataParallelBase& ddp) {
#ifdef COHORT_HAVE_NCCL
    check_accumulators(ddp.reducer().parameters());
#endif
    ddps_.push_back(&ddp);
    return *this;
  }
  // A capturable optimizer the step calls (Note [A step inside a CUDA graph]).
  CapturedStep& use(optim::Capturable& optimizer) {
    if (!optimizer.capturable())
      throw ConfigError("cohort CapturedStep: the optimizer was not made capturable; call capturable(true) on it "
                        "before its first step (Note [A step inside a CUDA graph])");
    optimizers_.push_back(&optimizer);
    return *this;
  }

  // One training step; returns what the step returned (the loss), valid until the
  // next run(). Note [One graph for the whole step].
  at::Tensor run() {
    if (failed_)
      throw ConfigError("cohort CapturedStep: an earlier capture failed part-way, which leaves DDP's step open "
                        "(its collectives were recorded, never run); stop the process, or make DDP and the step anew");
    for (auto* o : optimizers_) o->load_learning_rates();
#ifdef COHORT_HAVE_NCCL
    if (!graph_ && steps_ < options_.warmup_steps()) {
      ++steps_;
      return on_side_stream([&] { return step_(); });
    }
    if (!graph_) capture();
    graph_->replay();
    for (auto* o : optimizers_) o->count_steps(+1);  // the host did not see the replayed step
    ++steps_;
    return output_;
#else
    return step_();  // unreachable: the constructor refused
#endif
  }

  bool captured() const {
#ifdef COHORT_HAVE_NCCL
    return graph_ != nullptr;
#else
    return false;
#endif
  }
  std::int64_t steps() const { return steps_; }

 private:
#ifdef COHORT_HAVE_NCCL
  // Runs `fn` on the side stream, ordered after and before the caller's stream.
  // Note [Gradient accumulators on the capture stream]
  // A parameter's AccumulateGrad node runs on the stream that was current when the
  // node was made (its input metadata keeps it, and autograd offers no way to change
  // it), and DDP's reducer holds its parameters' nodes, made when DDP was built. Made
  // on another stream than the capture's, backward would accumulate (and DDP's hooks
  // copy and reduce) on a stream the capture does not record, and the capture would
  // fail. So DDP must be built under a guard of the capture stream, and use(ddp)
  // checks that it was, naming the fix.
  void check_accumulators(const std::vector<at::Tensor>& params) const {
    for (const auto& p : params) {
      auto node = torch::autograd::impl::grad_accumulator(p);
      if (!node || node->num_inputs() != 1) continue;
      const auto stream = node->input_metadata(0).stream();
      if (stream != side_->unwrap())
        throw ConfigError("cohort CapturedStep: DDP was built on " + c10::str(stream) + ", but the step is captured "
                          "on " + c10::str(side_->unwrap()) + ", and DDP's gradient accumulators run on the stream "
                          "it was built on (Note [Gradient accumulators on the capture stream]); fix: make the stream "
                          "first (auto s = cohort::cuda_graphs::capture_stream(device)), build DDP under "
                          "c10::StreamGuard guard(s), and pass CapturedStepOptions(device).stream(s)");
    }
  }

  template <class Fn>
  at::Tensor on_side_stream(Fn&& fn) {
    const auto index = side_->device_index();
    auto caller = c10::cuda::getCurrentCUDAStream(index);
    at::cuda::CUDAEvent inputs_ready;
    inputs_ready.record(caller);
    inputs_ready.block(*side_);
    at::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(*side_);
      out = fn();
    }
    at::cuda::CUDAEvent done;
    done.record(*side_);
    done.block(caller);
    return out;
  }

  void capture() {
    for (auto* d : ddps_) {
      const auto why = why_not_capturable(*d);
      if (!why.empty()) throw ConfigError("cohort CapturedStep: DDP's step cannot be captured: " + why);
    }
    // Note [Capturing beside NCCL's watchdog]: ProcessGroupNCCL's watchdog thread
    // queries the events of collectives still in its list, and in CUDA's global
    // capture mode a query from any thread during a capture fails it. So the warm-up's
    // work is finished first (one host wait, once), and the capture is thread-local:
    // it still records what any thread launches into the captured stream (backward
    // runs on autograd's device thread), while other threads' queries stay legal.
    c10::cuda::device_synchronize();
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    output_ = on_side_stream([&] {
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      at::Tensor out;
      try {
        out = step_();
      } catch (...) {
        failed_ = true;
        try {
          graph->capture_end();
        } catch (...) {
        }
        throw;
      }
      graph->capture_end();
      return out;
    });
    // The capture counted a step on the host that did not run (Note [A step inside a CUDA graph]).
    for (auto* o : optimizers_) o->count_steps(-1);
    graph_ = std::move(graph);
  }

  std::unique_ptr<c10::cuda::CUDAStream> side_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
#endif
  Step step_;
  CapturedStepOptions options_;
  std::vector<ddp::DistributedDataParallelBase*> ddps_;
  std::vector<optim::Capturable*> optimizers_;
  at::Tensor output_;
  std::int64_t steps_ = 0;
  bool failed_ = false;  // a capture threw part-way
};

}  // namespace cohort::cuda_graphs
