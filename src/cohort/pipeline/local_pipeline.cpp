#include "cohort/pipeline/local_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <fmt/format.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "cohort/errors.h"

namespace cohort::pipeline {

LocalPipeline::LocalPipeline(std::vector<torch::nn::Sequential> parts, std::vector<c10::Device> devices,
                             LocalPipelineOptions options)
    : parts_(std::move(parts)), devices_(std::move(devices)), options_(options) {
  if (parts_.empty() || parts_.size() != devices_.size())
    throw ConfigError(fmt::format("cohort LocalPipeline: {} parts and {} devices; give one device per part",
                                  parts_.size(), devices_.size()));
  if (options_.microbatches() < 1)
    throw ConfigError(fmt::format("cohort LocalPipeline: microbatches must be at least 1, got {}",
                                  options_.microbatches()));
  for (std::size_t k = 0; k < parts_.size(); ++k) {
    if (parts_[k]->is_empty())
      throw ConfigError(fmt::format("cohort LocalPipeline: part {} (for {}) has no layers", k, devices_[k].str()));
    parts_[k]->to(devices_[k]);
  }
}

std::vector<at::Tensor> LocalPipeline::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& p : parts_)
    for (const auto& t : p->parameters()) out.push_back(t);
  return out;
}

void LocalPipeline::train(bool on) {
  for (auto& p : parts_) p->train(on);
}

at::Tensor LocalPipeline::forward(const at::Tensor& input) {
  const int m = options_.microbatches();
  if (input.dim() == 0 || input.size(0) < m)
    throw ConfigError(fmt::format("cohort LocalPipeline: cannot cut an input of shape {} into {} micro-batches "
                                  "along dimension 0; use fewer micro-batches",
                                  c10::str(input.sizes()), m));
  const std::size_t n = parts_.size();
  // ready[k][i]: micro-batch i's input to part k, already on part k's device.
  std::vector<std::vector<std::promise<at::Tensor>>> ready(n + 1);
  std::vector<std::vector<std::shared_future<at::Tensor>>> inputs(n + 1);
  for (std::size_t k = 0; k <= n; ++k) {
    ready[k].resize(static_cast<std::size_t>(m));
    for (auto& p : ready[k]) inputs[k].push_back(p.get_future().share());
  }
  auto pieces = input.tensor_split(m, 0);
  for (int i = 0; i < m; ++i) ready[0][static_cast<std::size_t>(i)].set_value(pieces[i].to(devices_[0]));

  // Note [State of the device threads]: grad mode, autocast and the other
  // thread-local settings are per thread in ATen; each device thread adopts the
  // caller's, so `forward` under NoGradGuard or autocast behaves as it would inline.
  const at::ThreadLocalState state;

  // Note [Generators of the device threads]: parts on one device would draw from its
  // one default generator (dropout's masks) in whatever order their threads reach it,
  // so a fixed seed would not give the same forward twice. Each such part gets a
  // stream of its own instead: seeded here, in the calling thread, from the CPU
  // generator (so each call draws from the caller's seed), and swapped into the
  // device's generator for the part's turn; parts sharing a device take turns.
  std::map<std::string, int> sharing;
  for (const auto& d : devices_) ++sharing[d.str()];
  std::map<std::string, std::mutex> turns;  // made here: the threads only look up
  for (const auto& [device, count] : sharing) turns[device];
  std::vector<std::uint64_t> seeds(n);
  {
    auto cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    for (auto& seed : seeds) seed = cpu.get<at::CPUGeneratorImpl>()->random64();
  }
  std::vector<at::Tensor> streams(n);  // each part's generator state between its turns
  auto run_part = [&](std::size_t k, const at::Tensor& x) {
    if (sharing.at(devices_[k].str()) < 2 || !parts_[k]->is_training()) return parts_[k]->forward(x);
    std::lock_guard<std::mutex> turn(turns.at(devices_[k].str()));
    auto gen = at::globalContext().defaultGenerator(devices_[k]);
    at::Tensor outside;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      outside = gen.get_state();
      if (streams[k].defined()) gen.set_state(streams[k]);
      else gen.set_current_seed(seeds[k]);
    }
    struct Restore {  // the device's own state comes back, whatever forward does
      at::Generator& gen;
      at::Tensor& saved;
      at::Tensor& outside;
      ~Restore() {
        std::lock_guard<std::mutex> lock(gen.mutex());
        saved = gen.get_state();
        gen.set_state(outside);
      }
    } restore{gen, streams[k], outside};
    return parts_[k]->forward(x);
  };

  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      at::ThreadLocalStateGuard guard(state);
      const auto next = k + 1 < n ? devices_[k + 1] : devices_[k];
      for (std::size_t i = 0; i < static_cast<std::size_t>(m); ++i) {
        try {
          auto y = run_part(k, inputs[k][i].get());
          ready[k + 1][i].set_value(y.to(next));
        } catch (const cohort::Error&) {  // upstream's failure, already named: pass it on
          ready[k + 1][i].set_exception(std::current_exception());
        } catch (const std::exception& e) {
          ready[k + 1][i].set_exception(std::make_exception_ptr(Error(fmt::format(
              "cohort LocalPipeline: part {} on {} failed on micro-batch {}: {}", k, devices_[k].str(), i, e.what()))));
        }
      }
    });
  }
  std::vector<at::Tensor> outputs;
  std::exception_ptr failure;
  for (auto& f : inputs[n]) {
    try {
      outputs.push_back(f.get());
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  return at::cat(outputs, 0);
}

}  // namespace cohort::pipeline
