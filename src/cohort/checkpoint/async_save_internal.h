#pragma once
// The writer thread of asynchronous checkpoints and the host copies it writes from.
// Internal: not installed, included by checkpointer*.cpp only.
//
// Note [Asynchronous checkpoints]
// A synchronous save holds the training loop for the serialising, the CRC-32s, the
// writes and the fsyncs. An asynchronous one holds it only for a copy:
//   1. save() on every rank does what must be collective, as a synchronous save does
//      (the generators' all-gather, a ZeRO or TP gather to rank 0), plus one flag
//      exchange at the start: rank 0 says whether the previous write failed, is
//      still running under WhenBusy::kSkip (this save is skipped on every rank), or
//      whether the step would be refused (Note [Never older than the newest]).
//   2. rank 0 copies the model's tensors and the optimizer's state into host
//      buffers (HostCopies): pinned and non-blocking for CUDA tensors, queued on the
//      current stream before the next step's kernels, so the step's in-place
//      updates cannot overtake the copy and the host does not wait for it; a device
//      event marks the end, which the writer thread waits for. The buffers are
//      kept and reused by the next save while shapes stay the same, so host memory
//      stays at one checkpoint's state however many are taken; a buffer that no
//      save used is freed.
//   3. a thread serialises the copies (torch.save's format, LibTorch's optimizer
//      archive), checksums, writes and fsyncs them and installs the directory with
//      its manifest last, exactly as a synchronous save does (Note [Checkpoint
//      directories]); then it prunes. A kill -9 at any moment leaves the previous
//      checkpoints as they were and at most a temporary directory, which no load
//      reads and the next save removes.
//   4. At most one write is in flight: the buffers of step 2 are the ones it reads.
//      A save that comes due meanwhile waits for it (kWait) or is skipped (kSkip).
//      A write that fails is not retried: its temporary directory is removed,
//      write_failure() names it on rank 0 at once, and the next save() or wait()
//      throws it on every rank, so a full disk stops training as it does when
//      saving synchronously, one checkpoint later, and never leaves a step-N that
//      looks whole.
// The optimizer's state is copied tensor by tensor for LibTorch's Adam, AdamW, SGD,
// RMSprop and Adagrad (and cohort's, which derive from them): the copies are put in
// place of the live state for the moment LibTorch's save() records references to
// them in an archive, which the writer thread serialises. Any other optimizer (a
// ZeRO optimizer's gathered state, an optimizer of the user's) is serialised
// during save(), and only its writing is deferred.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "cohort/checkpoint/checkpointer.h"
#include "cohort/checkpoint/torch_format.h"

namespace cohort::checkpoint {

// Bytes made later, on the writer thread (or at once, for a synchronous save).
using Deferred = std::function<std::string()>;

// Host buffers for the state's copies, by name, reused between checkpoints.
class HostCopies {
 public:
  // A host copy of `t` in the buffer called `name`: queued on the current stream and
  // pinned when `t` is on a device. Valid until the next begin().
  at::Tensor copy(const std::string& name, const at::Tensor& t) {
    const auto source = t.detach();
    const bool device = !source.is_cpu();
    auto& buffer = buffers_[name];
    if (!buffer.defined() || buffer.sizes() != source.sizes() || buffer.scalar_type() != source.scalar_type() ||
        buffer.is_pinned() != device) {
      bytes_ -= buffer.defined() ? static_cast<std::int64_t>(buffer.nbytes()) : 0;
      buffer = at::empty(source.sizes(), at::TensorOptions().dtype(source.scalar_type()).pinned_memory(device));
      bytes_ += static_cast<std::int64_t>(buffer.nbytes());
      ++allocations_;
    }
    buffer.copy_(source, /*non_blocking=*/device);
    if (device) device_ = source.device();
    used_.insert(name);
    return buffer;
  }
  void begin() {
    used_.clear();
    device_.reset();
  }
  // Frees the buffers this checkpoint did not use (a model rebuilt since the last
  // one), and returns an event that completes with the copies queued on a device.
  std::optional<c10::Event> end() {
    for (auto it = buffers_.begin(); it != buffers_.end();) {
      if (used_.count(it->first) != 0) {
        ++it;
        continue;
      }
      bytes_ -= static_cast<std::int64_t>(it->second.nbytes());
      it = buffers_.erase(it);
    }
    if (!device_) return std::nullopt;
    c10::Event done(device_->type());
    done.record(c10::impl::VirtualGuardImpl(device_->type()).getStream(*device_));
    return done;
  }
  std::int64_t bytes() const { return bytes_; }
  std::int64_t allocations() const { return allocations_; }

 private:
  std::map<std::string, at::Tensor> buffers_;
  std::set<std::string> used_;
  std::optional<c10::Device> device_;
  std::int64_t bytes_ = 0;
  std::int64_t allocations_ = 0;
};

namespace async_detail {

template <class Key>
std::string key_name(const Key& key) {
  if constexpr (std::is_convertible_v<Key, std::string>) {
    return std::string(key);
  } else {
    return fmt::format("{}", static_cast<const void*>(key));
  }
}

inline at::Tensor copy_if_defined(HostCopies& copies, const std::string& name, const at::Tensor& t) {
  return t.defined() ? copies.copy(name, t) : t;
}

// Adam's and AdamW's states (two types with the same fields).
template <class State, class Copy>
std::unique_ptr<State> copy_moments(const State& s, const Copy& c) {
  auto out = std::make_unique<State>(s);
  out->exp_avg(c("exp_avg", s.exp_avg())).exp_avg_sq(c("exp_avg_sq", s.exp_avg_sq()));
  out->max_exp_avg_sq(c("max_exp_avg_sq", s.max_exp_avg_sq()));
  return out;
}

// A copy of one parameter's state whose tensors are host copies; nullptr for a
// state of a type this does not know.
inline std::unique_ptr<torch::optim::OptimizerParamState> copy_state(const torch::optim::OptimizerParamState& state,
                                                                     HostCopies& copies, const std::string& key) {
  namespace o = torch::optim;
  auto c = [&](const char* field, const at::Tensor& t) { return copy_if_defined(copies, key + "." + field, t); };
  if (const auto* s = dynamic_cast<const o::AdamParamState*>(&state)) return copy_moments(*s, c);
  if (const auto* s = dynamic_cast<const o::AdamWParamState*>(&state)) return copy_moments(*s, c);
  if (const auto* s = dynamic_cast<const o::SGDParamState*>(&state)) {
    auto out = std::make_unique<o::SGDParamState>(*s);
    out->momentum_buffer(c("momentum_buffer", s->momentum_buffer()));
    return out;
  }
  if (const auto* s = dynamic_cast<const o::RMSpropParamState*>(&state)) {
    auto out = std::make_unique<o::RMSpropParamState>(*s);
    out->square_avg(c("square_avg", s->square_avg())).momentum_buffer(c("momentum_buffer", s->momentum_buffer()));
    out->grad_avg(c("grad_avg", s->grad_avg()));
    return out;
  }
  if (const auto* s = dynamic_cast<const o::AdagradParamState*>(&state)) {
    auto out = std::make_unique<o::AdagradParamState>(*s);
    out->sum(c("sum", s->sum()));
    return out;
  }
  return nullptr;
}

}  // namespace async_detail

// The model's parameters and buffers by name, as state_dict() has them: host copies
// now, torch.save's bytes later.
inline Deferred model_copy(const std::vector<std::pair<std::string, at::Tensor>>& named, HostCopies& copies) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : named) dict.insert(name, copies.copy("model." + name, tensor));
  return [dict] { return torch_save_bytes(dict); };
}

// The optimizer's state (Note [Asynchronous checkpoints]): copied now and serialised
// later where its type is known, else serialised now. `serialise` is LibTorch's
// optimizer_bytes.
inline Deferred optimizer_copy(const torch::optim::Optimizer& optimizer, HostCopies& copies, bool state_is_local,
                               const std::function<std::string(const torch::optim::Optimizer&)>& serialise) {
  auto& live = const_cast<torch::optim::Optimizer&>(optimizer).state();
  std::remove_reference_t<decltype(live)> copied;
  bool known = state_is_local;
  for (auto it = live.begin(); known && it != live.end(); ++it) {
    auto copy = async_detail::copy_state(*it->second, copies, "optimizer." + async_detail::key_name(it->first));
    if (!copy) known = false;
    else copied[it->first] = std::move(copy);
  }
  if (!known) {
    auto bytes = std::make_shared<std::string>(serialise(optimizer));
    return [bytes] { return *bytes; };
  }
  // The archive records references to the copies, never to the live state: the two
  // maps are swapped only for the call to save().
  auto archive = std::make_shared<torch::serialize::OutputArchive>();
  struct Swap {
    decltype(live)& a;
    decltype(copied)& b;
    Swap(decltype(live)& x, decltype(copied)& y) : a(x), b(y) { std::swap(a, b); }
    ~Swap() { std::swap(a, b); }
  };
  {
    Swap swap(live, copied);
    optimizer.save(*archive);
  }
  // `copied` holds the state objects whose tensors the archive references; keep it.
  auto keep = std::make_shared<std::remove_reference_t<decltype(live)>>(std::move(copied));
  return [archive, keep] {
    std::ostringstream out;
    archive->save_to(out);
    return out.str();
  };
}

// CPU time the calling thread has used, in seconds.
inline double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The writer thread and what it reports (Note [Asynchronous checkpoints]).
class AsyncSave {
 public:
  AsyncSave() = default;
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  ~AsyncSave() { settle(); }

  HostCopies& copies() { return copies_; }

  // Whether a write is still running.
  bool busy() const { return thread_.joinable() && !finished_.load(); }

  // Waits for the write in flight, if any; its outcome is kept.
  void settle() {
    if (thread_.joinable()) thread_.join();
  }

  // Runs `write` (the checkpoint of `path`) on the writer thread once `ready` has
  // completed. The caller has settled the previous write.
  void start(std::string path, std::function<void()> write, std::optional<c10::Event> ready) {
    settle();
    finished_ = false;
    ++stats_.started;
    thread_ = std::thread([this, path = std::move(path), write = std::move(write), ready = std::move(ready)]() mutable {
      const auto begin = std::chrono::steady_clock::now();
      const double cpu_begin = thread_cpu_seconds();
      std::string failure;
      try {
        // LibTorch 1.13's c10::Event has no synchronize(): poll the copies' end.
        while (ready && !ready->query()) std::this_thread::sleep_for(std::chrono::microseconds(100));
        write();
      } catch (const std::exception& e) {
        failure = fmt::format("the asynchronous write of the checkpoint {} failed: {}", path, e.what());
      } catch (...) {
        failure = fmt::format("the asynchronous write of the checkpoint {} failed", path);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.last_write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      stats_.writer_cpu_s += thread_cpu_seconds() - cpu_begin;
      if (failure.empty()) {
        ++stats_.written;
      } else {
        ++stats_.failed;
        failure_ = std::move(failure);
      }
      finished_ = true;
    });
  }

  std::optional<std::string> failure() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }
  std::optional<std::string> take_failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    auto out = std::move(failure_);
    failure_.reset();
    return out;
  }
  void skipped() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.skipped;
  }
  void blocked_for(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.last_blocked_s = seconds;
  }
  AsyncStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto out = stats_;
    out.host_bytes = copies_.bytes();
    out.host_allocations = copies_.allocations();
    return out;
  }

 private:
  HostCopies copies_;
  std::thread thread_;
  std::atomic<bool> finished_{true};
  mutable std::mutex mutex_;
  std::optional<std::string> failure_;
  AsyncStats stats_;
};

}  // namespace cohort::checkpoint
